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
}

impl ProfileFrame {
    /// The name to show for this frame.
    pub fn name(&self) -> &str {
        match self {
            ProfileFrame::Process(name) | ProfileFrame::Thread(name) => name,
            ProfileFrame::Code(frame) => &frame.name,
            ProfileFrame::Truncated => "[truncated]",
        }
    }

    /// Whether this frame is kernel code.
    pub fn is_kernel(&self) -> bool {
        matches!(self, ProfileFrame::Code(f) if f.kind == FrameKind::Kernel)
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
    /// User stacks lost to stack-map hash collisions.
    pub user_stack_collision: u64,
    /// User stacks lost because the stack map was full.
    pub user_stack_map_full: u64,
    /// User stacks that could not be read.
    pub user_stack_error: u64,
    /// Kernel stacks lost to stack-map hash collisions.
    pub kernel_stack_collision: u64,
    /// Kernel stacks lost because the stack map was full.
    pub kernel_stack_map_full: u64,
    /// Kernel stacks that could not be read.
    pub kernel_stack_error: u64,
    /// Samples whose stack was cut at the depth limit (kept, marked `[truncated]`).
    pub truncated: u64,
}

impl Losses {
    /// Each non-zero loss with a readable name.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        [
            ("sample map full", self.sample_map_full),
            ("user stack collision", self.user_stack_collision),
            ("user stack map full", self.user_stack_map_full),
            ("user stack unreadable", self.user_stack_error),
            ("kernel stack collision", self.kernel_stack_collision),
            ("kernel stack map full", self.kernel_stack_map_full),
            ("kernel stack unreadable", self.kernel_stack_error),
            ("truncated stacks", self.truncated),
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
#[derive(Clone, Debug, Default)]
pub struct AggregateOptions {
    /// Keep each thread apart, under its process.
    pub per_thread: bool,
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
        let process = interner.intern(ProfileFrame::Process(comm));
        for sample in input.samples {
            let mut frames = vec![process];
            if options.per_thread {
                let name = thread_name(input.target.pid, sample.tid);
                frames.push(interner.intern(ProfileFrame::Thread(name)));
            }
            if sample.truncated {
                truncated += sample.count;
                frames.push(interner.intern(ProfileFrame::Truncated));
            }
            let user: Vec<u64> = lookup_addresses(&sample.user_frames).collect();
            for addr in user.iter().rev() {
                for frame in symbolizer.user(input.maps, *addr).iter() {
                    frames.push(interner.intern(ProfileFrame::Code(frame.clone())));
                }
            }
            let kernel: Vec<u64> = lookup_addresses(&sample.kernel_frames).collect();
            for addr in kernel.iter().rev() {
                for frame in symbolizer.kernel(*addr).iter() {
                    frames.push(interner.intern(ProfileFrame::Code(frame.clone())));
                }
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

fn thread_name(pid: u32, tid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
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
