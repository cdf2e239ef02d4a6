//! Aggregation: symbolized samples become a [`Profile`], stacks of interned frames with counts,
//! rooted at the process, plus everything a reader needs to judge the profile.

use std::{collections::HashMap, time::Duration};

use serde::Serialize;

use crate::{
    procmaps::ProcessMaps,
    sample::Sample,
    sampling::Sampling,
    symbolize::{lookup_addresses, Frame, FrameKind, Symbolizer},
    target::Target,
};

/// Index of a frame in [`Profile::frames`].
pub type FrameId = usize;

/// What a profile frame is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProfileFrame {
    /// The root of every stack of one process: its name.
    Process(String),
    /// A thread, below its process (only with per-thread profiles).
    Thread(String),
    /// A code frame.
    Code(Frame),
    /// Marks the root end of a stack cut by the depth limit: outer frames are missing.
    Truncated,
    /// A sample tag of the run, above the process (only when the run has tags).
    Tag(Tag),
}

impl ProfileFrame {
    /// The name to show for this frame.
    pub fn name(&self) -> &str {
        match self {
            ProfileFrame::Process(name) | ProfileFrame::Thread(name) => name,
            ProfileFrame::Code(frame) => &frame.name,
            ProfileFrame::Truncated => "[truncated]",
            ProfileFrame::Tag(tag) => &tag.label,
        }
    }

    /// The name with `file:line` appended where the frame has a line.
    pub fn label(&self) -> String {
        match self {
            ProfileFrame::Code(Frame {
                name,
                file: Some(file),
                line: Some(line),
                ..
            }) => {
                let file = std::path::Path::new(file)
                    .file_name()
                    .map(|f| f.to_string_lossy())
                    .unwrap_or_default();
                format!("{name} ({file}:{line})")
            }
            other => other.name().to_string(),
        }
    }

    /// Whether this frame is kernel code.
    pub fn is_kernel(&self) -> bool {
        matches!(self, ProfileFrame::Code(f) if f.kind == FrameKind::Kernel)
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

/// One distinct stack with its sample count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackCount {
    /// Frames, root first.
    pub frames: Vec<FrameId>,
    /// Samples with this stack.
    pub count: u64,
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
}

impl ProfileMeta {
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
    /// bpfprof's own CPU time (user + system) over the run, in seconds.
    pub profiler_cpu_secs: f64,
    /// bpfprof's peak resident memory, in bytes.
    pub profiler_peak_rss_bytes: u64,
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
}

impl Profile {
    /// Samples in the profile.
    pub fn total_samples(&self) -> u64 {
        self.stacks.iter().map(|s| s.count).sum()
    }
}

/// How samples are turned into stacks.
#[derive(Clone, Debug)]
pub struct AggregateOptions {
    /// Keep each thread apart, under its process.
    pub per_thread: bool,
    /// Deepest stack kept (kernel and user frames together, before inline expansion).
    pub max_stack_length: usize,
    /// Keep source lines on frames (else frames of one function merge).
    pub line_numbers: bool,
    /// Tags put above the process frame.
    pub tags: Vec<Tag>,
}

impl Default for AggregateOptions {
    fn default() -> Self {
        AggregateOptions {
            per_thread: false,
            max_stack_length: profiler_common::MAX_STACK_DEPTH,
            line_numbers: false,
            tags: Vec::new(),
        }
    }
}

/// One target's samples and what is needed to symbolize them.
pub struct TargetSamples<'a> {
    /// The process.
    pub target: &'a Target,
    /// Its memory layout, captured while it lived.
    pub maps: &'a ProcessMaps,
    /// Its samples.
    pub samples: &'a [Sample],
}

/// Builds the stacks of a profile from the samples of each target.
pub fn aggregate(
    inputs: &[TargetSamples<'_>],
    symbolizer: &mut Symbolizer,
    options: &AggregateOptions,
) -> (Vec<ProfileFrame>, Vec<StackCount>, u64) {
    let mut interner = Interner::default();
    let mut stacks: HashMap<Vec<FrameId>, u64> = HashMap::new();
    let mut truncated = 0;
    for input in inputs {
        symbolizer.prepare_user(
            input.maps,
            input
                .samples
                .iter()
                .flat_map(|s| lookup_addresses(&s.user_frames)),
        );
        symbolizer.prepare_kernel(
            input
                .samples
                .iter()
                .flat_map(|s| lookup_addresses(&s.kernel_frames)),
        );
        let comm = if input.maps.comm().is_empty() {
            input.target.comm.clone()
        } else {
            input.maps.comm().to_string()
        };
        let mut root: Vec<FrameId> = options
            .tags
            .iter()
            .map(|t| interner.intern(ProfileFrame::Tag(t.clone())))
            .collect();
        root.push(interner.intern(ProfileFrame::Process(comm)));
        let mut threads: HashMap<u32, FrameId> = HashMap::new();
        for sample in input.samples {
            let mut frames = root.clone();
            if options.per_thread {
                let id = *threads.entry(sample.tid).or_insert_with(|| {
                    let name = thread_name(input.target, input.maps, sample.tid);
                    interner.intern(ProfileFrame::Thread(name))
                });
                frames.push(id);
            }
            // The limit keeps the leaf-most frames: kernel frames first, then user frames.
            let limit = options.max_stack_length;
            let kernel: Vec<u64> = lookup_addresses(&sample.kernel_frames)
                .take(limit)
                .collect();
            let user: Vec<u64> = lookup_addresses(&sample.user_frames)
                .take(limit - kernel.len())
                .collect();
            let cut =
                kernel.len() + user.len() < sample.kernel_frames.len() + sample.user_frames.len();
            if sample.truncated || cut {
                truncated += sample.count;
                frames.push(interner.intern(ProfileFrame::Truncated));
            }
            let mut push = |frame: &Frame| {
                let mut frame = frame.clone();
                if !options.line_numbers {
                    frame.line = None;
                }
                frames.push(interner.intern(ProfileFrame::Code(frame)));
            };
            for addr in user.iter().rev() {
                symbolizer
                    .user(input.maps, *addr)
                    .iter()
                    .for_each(&mut push);
            }
            for addr in kernel.iter().rev() {
                symbolizer.kernel(*addr).iter().for_each(&mut push);
            }
            *stacks.entry(frames).or_default() += sample.count;
        }
    }
    let mut stacks: Vec<StackCount> = stacks
        .into_iter()
        .map(|(frames, count)| StackCount { frames, count })
        .collect();
    stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
    (interner.frames, stacks, truncated)
}

/// Names a thread by its `comm`. Sample tids are as seen in the target's namespace, so the
/// name is read only when that namespace's pids are ours (the target's pid is its ns pid).
fn thread_name(target: &Target, maps: &ProcessMaps, tid: u32) -> String {
    let comm = if target.pid == target.ns_pid {
        maps.thread_name(tid).unwrap_or_default().to_string()
    } else {
        String::new()
    };
    if comm.is_empty() {
        format!("tid {tid}")
    } else {
        format!("{comm} (tid {tid})")
    }
}

#[derive(Default)]
struct Interner {
    frames: Vec<ProfileFrame>,
    ids: HashMap<ProfileFrame, FrameId>,
}

impl Interner {
    fn intern(&mut self, frame: ProfileFrame) -> FrameId {
        if let Some(id) = self.ids.get(&frame) {
            return *id;
        }
        let id = self.frames.len();
        self.frames.push(frame.clone());
        self.ids.insert(frame, id);
        id
    }
}
