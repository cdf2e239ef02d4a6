//! The profile model every writer reads: interned frames, stacks with counts and addresses,
//! the mappings those addresses fall in, and the run's metadata (targets, sampling, tags,
//! losses, cost). [`crate::recording::aggregate`] builds it; each writer in [`crate::output`] renders it
//! its own way (tags as pprof labels, as root frames in flame graphs, as speedscope names).

pub mod sample;

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use serde::Serialize;

use crate::{
    sampling::Sampling,
    symbolize::{Frame, FrameKind},
};

/// Index of a frame in [`Profile::frames`].
pub type FrameId = usize;

/// What a profile frame is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProfileFrame {
    /// The root of every stack of one process.
    Process {
        /// How the frame shows: its name, with `(pid N)` in runs that can have more than one
        /// process (so that two of one name stay apart in every format).
        name: String,
        /// Its pid in bpfprof's namespace, so writers need not guess it back from the name.
        pid: u32,
        /// The process's own name (`comm`).
        comm: String,
    },
    /// A thread, below its process (only with per-thread profiles).
    Thread {
        /// How the frame shows: `comm (tid N)`, or `tid N` when the name is unknown.
        name: String,
        /// Thread id as seen in the target's pid namespace.
        tid: u32,
        /// The thread's own name (`comm`), empty when unknown.
        comm: String,
    },
    /// A code frame.
    Code(Frame),
    /// Marks the root end of a stack cut by the depth limit: outer frames are missing.
    Truncated,
    /// A sample tag of the run, above the process (only when the run has tags).
    Tag(Tag),
    /// The leaf of an off-CPU stack: the thread left the CPU here, in this state (the stack's
    /// weight is time off the CPU, not samples).
    OffCpu(OffCpuState),
}

/// Why a thread was off the CPU: its state when it left, as the scheduler reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OffCpuState {
    /// Interruptible sleep (`S`): a futex, a pipe, a socket, a sleep.
    Sleeping,
    /// Uninterruptible sleep (`D`): disk I/O, some kernel locks.
    Disk,
    /// Runnable but not running (`R+`): preempted or yielding, waiting for a CPU (wall mode).
    Preempted,
}

impl OffCpuState {
    /// The state of an off-CPU sample kind; `None` for CPU samples.
    pub fn of(kind: profiler_common::SampleKind) -> Option<OffCpuState> {
        match kind {
            profiler_common::SampleKind::Cpu => None,
            profiler_common::SampleKind::Sleeping => Some(OffCpuState::Sleeping),
            profiler_common::SampleKind::Disk => Some(OffCpuState::Disk),
            profiler_common::SampleKind::Preempted => Some(OffCpuState::Preempted),
        }
    }

    /// The state's name, as labels show it (`sleeping`, `disk`, `preempted`).
    pub fn name(self) -> &'static str {
        match self {
            OffCpuState::Sleeping => "sleeping",
            OffCpuState::Disk => "disk",
            OffCpuState::Preempted => "preempted",
        }
    }

    /// The leaf frame's name: `[off-cpu: sleeping]`.
    pub fn frame_name(self) -> &'static str {
        match self {
            OffCpuState::Sleeping => "[off-cpu: sleeping]",
            OffCpuState::Disk => "[off-cpu: disk]",
            OffCpuState::Preempted => "[off-cpu: preempted]",
        }
    }
}

impl ProfileFrame {
    /// The name to show for this frame.
    pub fn name(&self) -> &str {
        match self {
            ProfileFrame::Process { name, .. } | ProfileFrame::Thread { name, .. } => name,
            ProfileFrame::Code(frame) => &frame.name,
            ProfileFrame::Truncated => "[truncated]",
            ProfileFrame::Tag(tag) => &tag.label,
            ProfileFrame::OffCpu(state) => state.frame_name(),
        }
    }

    /// The name with `file:line` appended where the frame has a line.
    pub fn label(&self) -> String {
        match self {
            ProfileFrame::Code(frame) => frame_label(frame, frame.line),
            other => other.name().to_string(),
        }
    }

    /// The function's name, with `file:first line` appended where known: one label per
    /// function whichever of its lines was sampled (for tables that list functions).
    /// Runtime (Python) frames keep their first line without `--line-numbers` (for pstats'
    /// keys); their labels show it only where the profile has lines.
    pub fn function_label(&self) -> String {
        match self {
            ProfileFrame::Code(frame)
                if matches!(frame.kind, FrameKind::Runtime(_)) && frame.line.is_none() =>
            {
                frame.name.to_string()
            }
            ProfileFrame::Code(frame) => frame_label(frame, frame.start_line),
            other => other.name().to_string(),
        }
    }

    /// Whether this frame is kernel code.
    pub fn is_kernel(&self) -> bool {
        matches!(self, ProfileFrame::Code(f) if f.kind == FrameKind::Kernel)
    }
}

/// `name (file:line)` where the frame has a file and `line`, else the name.
fn frame_label(frame: &Frame, line: Option<u32>) -> String {
    match (&frame.file, line) {
        (Some(file), Some(line)) => {
            let file = std::path::Path::new(&**file)
                .file_name()
                .map(|f| f.to_string_lossy())
                .unwrap_or_default();
            format!("{} ({file}:{line})", frame.name)
        }
        _ => frame.name.to_string(),
    }
}

/// A sample tag: `key=value`, or a bare value from `--sample-tags` (key `tag`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Tag {
    /// The key (`tag` for bare strobelight-style tags).
    pub key: String,
    /// The value.
    pub value: String,
    /// How the tag shows as a frame: `[tag value]` or `[key=value]`.
    #[serde(skip)]
    pub label: String,
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

impl Tag {
    /// The key that `--sample-tags` values get.
    pub const BARE_KEY: &'static str = "tag";
    /// Longest key or value accepted.
    pub const MAX_LEN: usize = 128;
    /// Keys a run's tag may not have: the labels that the agent and the exporter set
    /// themselves on every process's samples (the daemon's run id and owner, the agent's
    /// process labels). A tag under one of them would pass for what bpfprof says (a user's
    /// `owner_uid=0` beside the real one) or be dropped by the agent.
    pub const RESERVED_KEYS: &'static [&'static str] = &[
        "run_id",
        "owner_uid",
        "pid",
        "comm",
        "service_name",
        "executable",
        "container_id",
        "host",
        "tid",
        "thread_comm",
    ];

    /// Validates and builds a tag; keys and values are 1 to 128 characters from
    /// `[A-Za-z0-9_.:/@+-]`, so they survive every output format unescaped.
    pub fn new(key: &str, value: &str) -> Result<Tag, String> {
        for (what, s) in [("key", key), ("value", value)] {
            if s.is_empty() || s.len() > Self::MAX_LEN {
                return Err(format!(
                    "tag {what} {s:?} must be 1 to {} characters long",
                    Self::MAX_LEN
                ));
            }
            if let Some(c) = s
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || "_.:/@+-".contains(*c)))
            {
                return Err(format!(
                    "tag {what} {s:?} has {c:?}: only letters, digits and _ . : / @ + - are allowed"
                ));
            }
        }
        let label = if key == Self::BARE_KEY {
            format!("[tag {value}]")
        } else {
            format!("[{key}={value}]")
        };
        Ok(Tag {
            key: key.to_string(),
            value: value.to_string(),
            label,
        })
    }

    /// Parses `key=value`, or a bare value as a `tag` tag.
    pub fn parse(s: &str) -> Result<Tag, String> {
        match s.split_once('=') {
            Some((k, v)) => Tag::new(k, v),
            None => Tag::new(Self::BARE_KEY, s),
        }
    }
}

/// What a stack adds up: samples (or intervals off the CPU) and time off the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weight {
    /// CPU samples, or intervals off the CPU for an off-CPU stack.
    pub count: u64,
    /// Nanoseconds off the CPU (0 for a CPU stack).
    pub off_cpu_ns: u64,
}

impl std::ops::AddAssign for Weight {
    fn add_assign(&mut self, other: Weight) {
        self.count += other.count;
        self.off_cpu_ns += other.off_cpu_ns;
    }
}

/// One distinct stack with its sample count. Stacks that differ only in the addresses of
/// their frames are kept apart (pprof shows addresses); writers that show names merge them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackCount {
    /// Frames, root first.
    pub frames: Vec<FrameId>,
    /// Samples with this stack (for an off-CPU stack: intervals off the CPU).
    pub count: u64,
    /// Nanoseconds off the CPU (an off-CPU stack, whose leaf is [`ProfileFrame::OffCpu`]).
    pub off_cpu_ns: u64,
    /// Per frame, where its instruction is, when known; empty when no frame's is.
    pub addresses: Vec<Option<CodeAddress>>,
}

impl StackCount {
    /// The distinct stacks of `counts` (frames and addresses to samples), most samples first,
    /// ties by frames then addresses so that every writer's output is stable.
    pub fn sorted(
        counts: impl IntoIterator<Item = ((Vec<FrameId>, Vec<Option<CodeAddress>>), Weight)>,
    ) -> Vec<StackCount> {
        let mut stacks: Vec<StackCount> = counts
            .into_iter()
            .map(|((frames, addresses), weight)| StackCount {
                frames,
                count: weight.count,
                off_cpu_ns: weight.off_cpu_ns,
                addresses,
            })
            .collect();
        stacks.sort_by(|a, b| {
            b.off_cpu_ns
                .cmp(&a.off_cpu_ns)
                .then_with(|| b.count.cmp(&a.count))
                .then_with(|| a.frames.cmp(&b.frames))
                .then_with(|| a.addresses.cmp(&b.addresses))
        });
        stacks
    }
}

impl StackCount {
    /// What the stack adds up.
    pub fn weight(&self) -> Weight {
        Weight {
            count: self.count,
            off_cpu_ns: self.off_cpu_ns,
        }
    }
}

/// Index of a mapping in [`Profile::mappings`].
pub type MappingId = usize;

/// Where a code frame's instruction is: the address the symbolizer looked up (a return
/// address minus one for callers) and the mapping holding it.
///
/// Packed: every frame of every stack has one (as an `Option`), and aligned it took 24
/// bytes a frame, most of a 25k-stack profile's memory; packed, 13.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C, packed)]
pub struct CodeAddress {
    /// The address in the process (or the kernel).
    pub address: u64,
    /// The mapping it lies in (a [`MappingId`]; a profile has far fewer than 2^32).
    pub mapping: u32,
}

impl CodeAddress {
    /// The mapping it lies in, as an index of [`Profile::mappings`].
    pub fn mapping_id(&self) -> MappingId {
        self.mapping as MappingId
    }
}

const _: () = assert!(std::mem::size_of::<Option<CodeAddress>>() == 13);

/// A binary mapped into a profiled process, or the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub limit: u64,
    /// File offset of `start`.
    pub file_offset: u64,
    /// Full path as the process sees it, `[vdso]`-style names, or `[kernel]`.
    pub path: String,
    /// GNU build id in hex, where the file has one.
    pub build_id: Option<String>,
    /// The process it is mapped in; `None` for the kernel.
    pub pid: Option<u32>,
    /// Whether it is the process's executable (pprof lists it first, as the main binary).
    pub executable: bool,
}

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
    /// Samples with a Python frame left unnamed (`[unknown Python code]`): its code object
    /// was freed, or its process exited, before bpfprof read it.
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

/// An aggregated, symbolized profile: what every output writer reads.
#[derive(Clone, Debug)]
pub struct Profile {
    /// How the profile was taken.
    pub meta: ProfileMeta,
    /// Interned frames.
    pub frames: Vec<ProfileFrame>,
    /// Distinct stacks with counts.
    pub stacks: Vec<StackCount>,
    /// Mappings that [`CodeAddress`]es point into.
    pub mappings: Vec<Mapping>,
    /// Labels of each process's samples beyond its pid and name, by pid (the agent's
    /// `service_name`, `executable`, `container_id`, `host`, daemon-run tags); pprof writes
    /// them as sample labels. Empty for a recording.
    pub process_labels: BTreeMap<u32, Vec<(String, String)>>,
    /// When each CPU sample was taken, for a run that recorded a timeline (`.trace.json`,
    /// `--timeline`); `None` otherwise.
    pub timeline: Option<Timeline>,
}

/// When each CPU sample of a profile was taken: what the trace writer draws and what orders
/// speedscope's samples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// The samples in time order (ties by process, thread and stack).
    pub samples: Vec<TimedSample>,
    /// Thread names (`comm`) by process pid and tid, where known.
    pub thread_names: BTreeMap<(u32, u32), String>,
    /// When the run started sampling and when it stopped, in `CLOCK_MONOTONIC` nanoseconds
    /// (the samples' clock).
    pub start_ns: u64,
    /// See [`Self::start_ns`].
    pub end_ns: u64,
    /// `CLOCK_REALTIME` minus `CLOCK_MONOTONIC` at the end of the run, in nanoseconds: added to
    /// a sample's time, it gives the Unix time (what torch.profiler's traces count in).
    pub realtime_offset_ns: i64,
}

/// One CPU sample on the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimedSample {
    /// When it was taken, `CLOCK_MONOTONIC` nanoseconds.
    pub time_ns: u64,
    /// The pid of its process (as its process frame has it; the pid in the process's namespace
    /// for a process known only by its samples).
    pub pid: u32,
    /// Its thread, as seen in the process's pid namespace.
    pub tid: u32,
    /// Its stack: an index in [`Profile::stacks`].
    pub stack: usize,
}

impl Timeline {
    /// The timeline with each sample's stack index passed through `map` (the stacks were
    /// rebuilt: a view, a merge), still in time order.
    pub fn remapped(&self, map: impl Fn(usize) -> usize) -> Timeline {
        let mut samples: Vec<TimedSample> = self
            .samples
            .iter()
            .map(|s| TimedSample {
                stack: map(s.stack),
                ..*s
            })
            .collect();
        samples.sort_unstable();
        Timeline {
            samples,
            ..self.clone()
        }
    }
}

impl Profile {
    /// CPU samples in the profile (off-CPU stacks count intervals, not samples: left out).
    pub fn total_samples(&self) -> u64 {
        self.stacks
            .iter()
            .filter(|s| self.off_cpu_state(s).is_none())
            .map(|s| s.count)
            .sum()
    }

    /// The state a stack was off the CPU in, `None` for a CPU stack (its leaf says).
    pub fn off_cpu_state(&self, stack: &StackCount) -> Option<OffCpuState> {
        match stack.frames.last().map(|&id| &self.frames[id]) {
            Some(ProfileFrame::OffCpu(state)) => Some(*state),
            _ => None,
        }
    }

    /// Nanoseconds a stack stands for: CPU samples times the sampling period, or its time
    /// off the CPU.
    pub fn stack_nanos(&self, stack: &StackCount) -> u64 {
        if self.off_cpu_state(stack).is_some() {
            stack.off_cpu_ns
        } else {
            stack.count * self.meta.sample_nanos()
        }
    }

    /// The weight the writers that show one number per stack give it: samples in a CPU
    /// profile, nanoseconds (CPU and off-CPU alike) in a profile with off-CPU time.
    pub fn stack_weight(&self, stack: &StackCount) -> u64 {
        if self.meta.off_cpu.is_some() {
            self.stack_nanos(stack)
        } else {
            stack.count
        }
    }

    /// Every stack's [`Self::stack_weight`], added up.
    pub fn total_weight(&self) -> u64 {
        self.stacks.iter().map(|s| self.stack_weight(s)).sum()
    }

    /// The unit of [`Self::stack_weight`]: `samples` or `ns`.
    pub fn weight_unit(&self) -> &'static str {
        if self.meta.off_cpu.is_some() {
            "ns"
        } else {
            "samples"
        }
    }

    /// Total CPU nanoseconds and off-CPU nanoseconds (by state) in the profile.
    pub fn time_totals(&self) -> (u64, BTreeMap<OffCpuState, u64>) {
        let mut cpu = 0;
        let mut off: BTreeMap<OffCpuState, u64> = BTreeMap::new();
        for stack in &self.stacks {
            match self.off_cpu_state(stack) {
                Some(state) => *off.entry(state).or_default() += stack.off_cpu_ns,
                None => cpu += stack.count * self.meta.sample_nanos(),
            }
        }
        (cpu, off)
    }

    /// The pid of the process a stack belongs to (its process frame), if it has one.
    pub fn stack_pid(&self, stack: &StackCount) -> Option<u32> {
        stack.frames.iter().find_map(|&id| match &self.frames[id] {
            ProfileFrame::Process { pid, .. } => Some(*pid),
            _ => None,
        })
    }

    /// One profile of the stacks of `parts` (consecutive windows of one recording, oldest
    /// first) whose process `keep` accepts: frames and mappings interned anew, the counts of
    /// equal stacks added, and so are durations, samples seen and losses; the sampling, tags
    /// and cost are the newest part's. `None` when there are no parts.
    pub fn merge(parts: &[&Profile], keep: impl Fn(u32) -> bool) -> Option<Profile> {
        let newest = *parts.last()?;
        let mut frames: Vec<ProfileFrame> = Vec::new();
        let mut frame_ids: HashMap<&ProfileFrame, FrameId> = HashMap::new();
        let mut mappings: Vec<Mapping> = Vec::new();
        let mut mapping_ids: HashMap<&Mapping, MappingId> = HashMap::new();
        let mut stacks: HashMap<(Vec<FrameId>, Vec<Option<CodeAddress>>), Weight> = HashMap::new();
        let mut meta = newest.meta.clone();
        meta.duration = Duration::ZERO;
        meta.samples_seen = 0;
        meta.losses = Losses::default();
        meta.unwound = Unwound::default();
        meta.targets = Vec::new();
        meta.limits_hit = Vec::new();
        meta.unavailable = Vec::new();
        meta.python_unsupported = Vec::new();
        let mut process_labels = BTreeMap::new();
        for part in parts {
            meta.duration += part.meta.duration;
            meta.samples_seen += part.meta.samples_seen;
            meta.losses.add(&part.meta.losses);
            meta.unwound.add(&part.meta.unwound);
            for target in &part.meta.targets {
                if keep(target.pid) && !meta.targets.iter().any(|t| t.pid == target.pid) {
                    meta.targets.push(target.clone());
                }
            }
            for said in &part.meta.limits_hit {
                if !meta.limits_hit.contains(said) {
                    meta.limits_hit.push(said.clone());
                }
            }
            for object in &part.meta.unavailable {
                if !meta.unavailable.iter().any(|o| o.name == object.name) {
                    meta.unavailable.push(object.clone());
                }
            }
            for said in &part.meta.python_unsupported {
                if !meta.python_unsupported.contains(said) {
                    meta.python_unsupported.push(said.clone());
                }
            }
            for (pid, labels) in &part.process_labels {
                if keep(*pid) {
                    process_labels.insert(*pid, labels.clone());
                }
            }
            for stack in &part.stacks {
                if !part.stack_pid(stack).is_some_and(&keep) {
                    continue;
                }
                let ids = stack
                    .frames
                    .iter()
                    .map(|&id| {
                        let frame = &part.frames[id];
                        *frame_ids.entry(frame).or_insert_with(|| {
                            frames.push(frame.clone());
                            frames.len() - 1
                        })
                    })
                    .collect();
                let addresses = stack
                    .addresses
                    .iter()
                    .map(|a| {
                        a.map(|a| {
                            let mapping = &part.mappings[a.mapping_id()];
                            let id = *mapping_ids.entry(mapping).or_insert_with(|| {
                                mappings.push(mapping.clone());
                                mappings.len() - 1
                            });
                            CodeAddress {
                                address: a.address,
                                mapping: id as u32,
                            }
                        })
                    })
                    .collect();
                *stacks.entry((ids, addresses)).or_default() += stack.weight();
            }
        }
        let stacks = StackCount::sorted(stacks);
        Some(Profile {
            meta,
            frames,
            stacks,
            mappings,
            process_labels,
            // Windows (the agent's) record no timeline.
            timeline: None,
        })
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
