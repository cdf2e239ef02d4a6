//! The profile model every writer reads: interned frames, stacks with counts and addresses,
//! the mappings those addresses fall in, and the run's metadata (targets, sampling, tags,
//! losses, cost). [`crate::recording::aggregate`] builds it; each writer in [`crate::output`] renders it
//! its own way (tags as pprof labels, as root frames in flame graphs, as speedscope names).

mod meta;
pub mod sample;

pub use meta::*;

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use serde::Serialize;

use crate::symbolize::{Frame, FrameKind};

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
