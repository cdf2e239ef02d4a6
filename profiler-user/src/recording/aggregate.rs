//! Aggregation: symbolized samples become a [`Profile`], stacks of interned frames with counts
//! and addresses, rooted at the process. The model itself is in [`crate::profile`].

use std::collections::HashMap;
use std::hash::BuildHasher;

use rustc_hash::FxHashMap;

use crate::profile::*;
use crate::{
    process::maps::ProcessMaps,
    process::target::Target,
    profile::sample::{take_shrinking, Sample},
    runtime::{by_tag, FrameOptions, Instance, View},
    symbolize::{lookup_addresses, Frame, FrameKind, Symbolizer},
};

/// How samples are turned into stacks.
#[derive(Clone, Debug)]
pub struct AggregateOptions {
    /// Keep each thread apart, under its process.
    pub per_thread: bool,
    /// Deepest stack kept (kernel and user frames together, before inline expansion; runtime
    /// frames on their own).
    pub max_stack_length: usize,
    /// Keep source lines on frames (else frames of one function merge).
    pub line_numbers: bool,
    /// Tags put above the process frame.
    pub tags: Vec<Tag>,
    /// How runtime frames are shown (`--python-glue`, `--python-gil`, `--python-view`).
    pub runtime: FrameOptions,
    /// Name each process's root frame `name (pid N)`: set by the recording for runs that can
    /// have more than one process, so that two processes of one name stay apart.
    pub pid_roots: bool,
    /// Record when each sample was taken and give the profile its [`Timeline`] (`.trace.json`
    /// outputs, `--timeline`, a daemon run asking for the `trace` format): the kernel writes
    /// each of the run's samples to its timeline ring then.
    pub timeline: bool,
    /// Keep each frame's address ([`StackCount::addresses`]), for outputs that show them
    /// (pprof, the agent's exports). Without them, stacks that differ only in addresses are
    /// one stack, as every other writer shows them: 13 bytes less a frame, at 25k unique
    /// stacks 17 MB of a command-line run's peak.
    pub addresses: bool,
}

impl AggregateOptions {
    /// `frame` as this profile shows it: without its lines unless lines were asked for.
    fn shown(&self, mut frame: Frame) -> Frame {
        if !self.line_numbers {
            frame.line = None;
            // A runtime function's first line comes with its code object (no debug info to
            // read), and pstats keys functions by it, as cProfile does.
            if !matches!(frame.kind, FrameKind::Runtime(_)) {
                frame.start_line = None;
            }
        }
        frame
    }
}

impl Default for AggregateOptions {
    fn default() -> Self {
        AggregateOptions {
            per_thread: false,
            max_stack_length: profiler_common::DEFAULT_STACK_DEPTH,
            line_numbers: false,
            tags: Vec::new(),
            runtime: Default::default(),
            pid_roots: false,
            timeline: false,
            addresses: true,
        }
    }
}

/// One target's samples and what is needed to symbolize them.
pub struct TargetSamples<'a> {
    /// The process.
    pub target: &'a Target,
    /// Its memory layout, captured while it lived.
    pub maps: &'a ProcessMaps,
    /// The pid its samples carry.
    pub sample_pid: u32,
    /// Its samples, taken: each is dropped once its stack is counted, so that the raw stacks
    /// give their memory to the profile being built rather than both being held at the end.
    pub samples: Vec<Sample>,
    /// Its runtime, when the kernel read its runtime's frames: their names.
    pub runtime: Option<&'a dyn Instance>,
    /// Whether the kernel's CFI walker walked its stacks, and so counted those that ended
    /// early itself.
    pub cfi_walked: bool,
}

/// The one frame standing for the user stack of a process that exited before bpfprof could
/// read its memory maps.
pub const EXITED_UNREAD: &str = "[user code: exited before its maps were read]";

/// Builds the profile of the samples of each target, consuming them; `meta` describes the
/// run, and gets the count of truncated stacks. Every address is named first; `after_naming` then gets the
/// symbolizer before any stack is built (a run's end drops its parsed debug info there, so
/// that the profile is built in that memory rather than beside it).
pub fn aggregate(
    inputs: Vec<TargetSamples<'_>>,
    symbolizer: &mut Symbolizer,
    options: &AggregateOptions,
    mut meta: ProfileMeta,
    after_naming: impl FnOnce(&mut Symbolizer),
) -> Profile {
    let mut interner = Interner::default();
    let mut mappings = Mappings::default();
    let mut stacks: Vec<(StackKey, Weight)> = Vec::new();
    // Each stack's place in `stacks`, found by the stack's hash: 4 bytes a stack, where a map
    // keyed by the stacks took 64 (3 MB at 23k stacks, the heap's peak by heaptrack).
    let mut index: hashbrown::HashTable<u32> = hashbrown::HashTable::new();
    let hash_of = |key: &StackKey| rustc_hash::FxBuildHasher.hash_one(key);
    let mut truncated = 0;
    let mut ended_early = 0;
    let mut runtime_unnamed = 0;
    // The timed samples' stacks, process pid, thread and times; indexed once stacks are sorted.
    let mut timed: Vec<(StackKey, u32, u32, Vec<u64>)> = Vec::new();
    let mut thread_names = std::collections::BTreeMap::new();
    // Each kernel address's frames, interned once for the whole profile.
    let mut kernel_frames = FrameMemo::default();
    symbolizer.set_start_lines(options.line_numbers);
    for input in &inputs {
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
    }
    after_naming(symbolizer);
    for mut input in inputs {
        let samples = std::mem::take(&mut input.samples);
        let input = &input;
        // Each user address's frames in this process, interned once: a sample's frames are
        // then copied ids, not names hashed again (that was most of the end of a run).
        let mut user_frames_of = FrameMemo::default();
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
        let pid = input.target.pid;
        root.push(interner.intern(ProfileFrame::Process {
            name: if options.pid_roots {
                // A process known only by its samples has no host pid: its samples' pid.
                format!(
                    "{comm} (pid {})",
                    if pid == 0 { input.sample_pid } else { pid }
                )
            } else {
                comm.clone()
            },
            pid,
            comm,
        }));
        let mut threads: FxHashMap<u32, FrameId> = FxHashMap::default();
        // The samples' own memory goes to the profile; reversed, they are taken in order.
        let mut samples = samples;
        samples.reverse();
        for mut sample in take_shrinking(samples) {
            let mut frames = root.clone();
            if options.per_thread {
                let id = *threads
                    .entry(sample.tid)
                    .or_insert_with(|| interner.intern(thread_frame(input, sample.tid)));
                frames.push(id);
            }
            // The limit keeps the leaf-most frames: kernel frames first, then user frames.
            let limit = options.max_stack_length;
            let kernel: Vec<u64> = lookup_addresses(&sample.kernel_frames)
                .take(limit)
                .collect();
            let mut user: Vec<u64> = lookup_addresses(&sample.user_frames)
                .take(limit - kernel.len())
                .collect();
            let cut =
                kernel.len() + user.len() < sample.kernel_frames.len() + sample.user_frames.len();
            // A frame-pointer walk through code without frame pointers reads data as return
            // addresses: the stack ends at the first address outside every mapping of the
            // process (no call returns there), keeping the frames found until then.
            if input.maps.is_known() {
                if let Some(bad) = user.iter().position(|a| !input.maps.maps_address(*a)) {
                    // The CFI walker stops at the first address outside the mappings, keeps
                    // it as the last frame, and counts the stack as ended early: counting it
                    // again here put 90 of 78 stacks as ended early.
                    let counted = input.cfi_walked && bad + 1 == user.len();
                    user.truncate(bad);
                    if !counted {
                        ended_early += sample.count;
                    }
                }
            }
            // Runtime frames keep their leaf-most `limit` too: the kernel walks up to 512.
            let (runtime_frames, runtime_cut) = match input.runtime.and_then(|r| by_tag(r.tag())) {
                Some(runtime) => runtime.cut(&sample.runtime_frames, limit),
                None => (sample.runtime_frames.to_vec(), false),
            };
            // A process that exited before its maps were read shows one frame for all its
            // user code (below): whether the walk was cut tells nothing more about it (the
            // cut stacks are frame-pointer walks through data, 127 "frames" deep).
            let unread_user = !input.maps.is_known() && !user.is_empty();
            if (sample.truncated || cut || runtime_cut) && !unread_user {
                truncated += sample.count;
                frames.push(interner.intern(ProfileFrame::Truncated));
            }
            let mut addresses = vec![None; frames.len()];
            if let Some(named) = input.runtime.map(|r| r.frames()) {
                if named.has_unnamed(&runtime_frames) {
                    runtime_unnamed += sample.count;
                }
                // Runtime frames go between native ones by name: merged as frames.
                let mut user_frames: Vec<(Frame, Option<CodeAddress>)> = Vec::new();
                if unread_user {
                    user.clear();
                    user_frames.push((Frame::named(EXITED_UNREAD, None, FrameKind::User), None));
                }
                for addr in user.iter().rev() {
                    let address = options
                        .addresses
                        .then(|| mappings.user(input.target.pid, input.maps, *addr))
                        .flatten();
                    for frame in symbolizer.user(input.maps, *addr).iter() {
                        user_frames.push((frame.clone(), address));
                    }
                }
                let user_frames = named.merge(user_frames, &runtime_frames, options.runtime);
                for (frame, address) in user_frames {
                    let frame = options.shown(frame);
                    frames.push(interner.intern(ProfileFrame::Code(frame)));
                    addresses.push(address);
                }
            } else if unread_user {
                // A process that exited before its maps were read (a shell pipeline's
                // `head`, a shim's `bash`): its addresses name nothing, and one frame per
                // address split its few samples into as many meaningless stacks.
                let frame = Frame::named(EXITED_UNREAD, None, FrameKind::User);
                frames.push(interner.intern(ProfileFrame::Code(frame)));
                addresses.push(None);
            } else {
                for addr in user.iter().rev() {
                    let resolved = user_frames_of.get(*addr, || {
                        // Found only where kept: finding one copies its mapping's path.
                        let address = options
                            .addresses
                            .then(|| mappings.user(input.target.pid, input.maps, *addr))
                            .flatten();
                        symbolizer
                            .user(input.maps, *addr)
                            .iter()
                            .map(|f| {
                                let frame = options.shown(f.clone());
                                (interner.intern(ProfileFrame::Code(frame)), address)
                            })
                            .collect()
                    });
                    for (id, address) in resolved {
                        frames.push(*id);
                        addresses.push(*address);
                    }
                }
            }
            for addr in kernel.iter().rev() {
                let resolved = kernel_frames.get(*addr, || {
                    let address = options.addresses.then(|| mappings.kernel(*addr));
                    symbolizer
                        .kernel(*addr)
                        .iter()
                        .map(|f| {
                            let frame = options.shown(f.clone());
                            (interner.intern(ProfileFrame::Code(frame)), address)
                        })
                        .collect()
                });
                for (id, address) in resolved {
                    frames.push(*id);
                    addresses.push(*address);
                }
            }
            if let Some(state) = OffCpuState::of(sample.kind) {
                frames.push(interner.intern(ProfileFrame::OffCpu(state)));
                addresses.push(None);
            }
            if !options.addresses {
                addresses = Vec::new();
            }
            if options.timeline && !sample.times_ns.is_empty() {
                let pid = if pid == 0 { input.sample_pid } else { pid };
                timed.push((
                    (frames.clone(), addresses.clone()),
                    pid,
                    sample.tid,
                    std::mem::take(&mut sample.times_ns),
                ));
                if let ProfileFrame::Thread { comm, .. } = thread_frame(input, sample.tid) {
                    if !comm.is_empty() {
                        thread_names.insert((pid, sample.tid), comm);
                    }
                }
            }
            let weight = Weight {
                count: sample.count,
                off_cpu_ns: sample.off_cpu_ns,
            };
            let key = (frames, addresses);
            let hash = hash_of(&key);
            match index.find(hash, |&i| stacks[i as usize].0 == key) {
                Some(&i) => stacks[i as usize].1 += weight,
                None => {
                    // Kept for the profile's life: without the room the pushes left (up to
                    // as much again), 25k stacks of 40 frames took 10 MB more.
                    let (mut frames, mut addresses) = key;
                    frames.shrink_to_fit();
                    addresses.shrink_to_fit();
                    index.insert_unique(hash, stacks.len() as u32, |&i| {
                        hash_of(&stacks[i as usize].0)
                    });
                    stacks.push(((frames, addresses), weight));
                }
            }
        }
    }
    drop(index);
    let stacks = StackCount::sorted(stacks);
    let timeline = options.timeline.then(|| {
        let index: FxHashMap<(&[FrameId], &[Option<CodeAddress>]), usize> = stacks
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.frames.as_slice(), s.addresses.as_slice()), i))
            .collect();
        let mut samples = Vec::new();
        for ((frames, addresses), pid, tid, times) in &timed {
            let stack = index[&(frames.as_slice(), addresses.as_slice())];
            samples.extend(times.iter().map(|&time_ns| TimedSample {
                time_ns,
                pid: *pid,
                tid: *tid,
                stack,
            }));
        }
        samples.sort_unstable();
        Timeline {
            samples,
            thread_names,
            ..Timeline::default()
        }
    });
    meta.losses.truncated = truncated;
    meta.losses.stack_ended_early += ended_early;
    meta.unwound.python_unnamed += runtime_unnamed;
    let profile = Profile {
        meta,
        frames: interner.frames,
        stacks,
        mappings: mappings.finish(),
        process_labels: Default::default(),
        timeline,
    };
    if options.runtime.view == View::All {
        python_view(&profile)
    } else {
        profile
    }
}

/// The runtimes' (Python) view of `profile`: each stack's frames below its innermost runtime
/// function that are the interpreter's own C code folded into that function
/// ([`crate::runtime::view_keep`]), stacks that become equal merged. The one place the view
/// is made, for every output that shows it.
pub fn python_view(profile: &Profile) -> Profile {
    let mut interner = Interner::default();
    let mut stacks: HashMap<(Vec<FrameId>, Vec<Option<CodeAddress>>), Weight> = HashMap::new();
    // Each old stack's key in the view, for the timeline's indices.
    let mut keys = Vec::with_capacity(profile.stacks.len());
    for stack in &profile.stacks {
        let code: Vec<Option<&Frame>> = stack
            .frames
            .iter()
            .map(|id| match &profile.frames[*id] {
                ProfileFrame::Code(f) => Some(f),
                _ => None,
            })
            .collect();
        let keep = crate::runtime::view_keep(&code);
        let mut frames = Vec::with_capacity(stack.frames.len());
        let mut addresses = Vec::with_capacity(stack.addresses.len());
        for (i, id) in stack.frames.iter().enumerate() {
            if keep[i] {
                frames.push(interner.intern(profile.frames[*id].clone()));
                if let Some(address) = stack.addresses.get(i) {
                    addresses.push(*address);
                }
            }
        }
        *stacks
            .entry((frames.clone(), addresses.clone()))
            .or_default() += stack.weight();
        keys.push((frames, addresses));
    }
    let stacks = StackCount::sorted(stacks);
    let timeline = profile.timeline.as_ref().map(|timeline| {
        let index: HashMap<(&[FrameId], &[Option<CodeAddress>]), usize> = stacks
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.frames.as_slice(), s.addresses.as_slice()), i))
            .collect();
        timeline.remapped(|old| {
            let (frames, addresses) = &keys[old];
            index[&(frames.as_slice(), addresses.as_slice())]
        })
    });
    Profile {
        meta: profile.meta.clone(),
        frames: interner.frames,
        stacks,
        mappings: profile.mappings.clone(),
        process_labels: profile.process_labels.clone(),
        timeline,
    }
}

/// The profile that pstats outputs show when the run left the Python view to them (the
/// default): `None` when every output shows the same profile.
pub fn pstats_view(profile: &Profile, options: &AggregateOptions) -> Option<Profile> {
    (options.runtime.view == View::Pstats).then(|| python_view(profile))
}

/// The mappings that addresses fall in, interned as stacks are built: one per executable
/// mapping of each process, and one for the kernel spanning every kernel address seen.
#[derive(Default)]
struct Mappings {
    list: Vec<Mapping>,
    ids: HashMap<Mapping, MappingId>,
    /// The kernel's mapping and the lowest and highest kernel address seen.
    kernel: Option<(MappingId, u64, u64)>,
}

impl Mappings {
    fn user(&mut self, pid: u32, maps: &ProcessMaps, addr: u64) -> Option<CodeAddress> {
        let info = maps.mapping_at(addr)?;
        let mapping = Mapping {
            start: info.start,
            limit: info.end,
            file_offset: info.offset,
            path: info.path,
            build_id: info.build_id,
            pid: Some(pid),
            executable: info.executable,
        };
        let next = self.list.len();
        let id = *self.ids.entry(mapping.clone()).or_insert(next);
        if id == next {
            self.list.push(mapping);
        }
        Some(CodeAddress {
            address: addr,
            mapping: id as u32,
        })
    }

    fn kernel(&mut self, addr: u64) -> CodeAddress {
        let (id, low, high) = self.kernel.get_or_insert_with(|| {
            self.list.push(Mapping {
                start: addr,
                limit: addr.saturating_add(1),
                file_offset: 0,
                path: "[kernel]".to_string(),
                build_id: None,
                pid: None,
                executable: false,
            });
            (self.list.len() - 1, addr, addr)
        });
        *low = (*low).min(addr);
        *high = (*high).max(addr);
        CodeAddress {
            address: addr,
            mapping: *id as u32,
        }
    }

    fn finish(mut self) -> Vec<Mapping> {
        if let Some((id, low, high)) = self.kernel {
            self.list[id].start = low;
            self.list[id].limit = high.saturating_add(1);
        }
        self.list
    }
}

/// A thread's frame, named by its `comm`. Sample tids are as seen in the namespace of the
/// sample's pid, so the name is read only when that namespace's pids are ours (the pid its
/// samples carry is its pid here: a target in bpfprof's namespace, any process of a
/// system-wide run).
fn thread_frame(input: &TargetSamples<'_>, tid: u32) -> ProfileFrame {
    let comm = if input.target.pid == input.sample_pid {
        input.maps.thread_name(tid).unwrap_or_default().to_string()
    } else {
        String::new()
    };
    let name = if comm.is_empty() {
        format!("tid {tid}")
    } else {
        format!("{comm} (tid {tid})")
    };
    ProfileFrame::Thread { name, tid, comm }
}

#[derive(Default)]
struct Interner {
    frames: Vec<ProfileFrame>,
    ids: FxHashMap<ProfileFrame, FrameId>,
}

/// A stack's frames and their addresses: what stacks are told apart by.
type StackKey = (Vec<FrameId>, Vec<Option<CodeAddress>>);

/// The interned frames (with their addresses) of each address seen, resolved once: an
/// address's frames are the same in every sample of one process (user code) or of the
/// machine (kernel code).
#[derive(Default)]
struct FrameMemo {
    /// Each address's frames, as a range of `frames`.
    ranges: FxHashMap<u64, (u32, u32)>,
    frames: Vec<(FrameId, Option<CodeAddress>)>,
}

impl FrameMemo {
    /// The frames at `addr`, outermost first, resolved by `resolve` the first time.
    fn get(
        &mut self,
        addr: u64,
        resolve: impl FnOnce() -> Vec<(FrameId, Option<CodeAddress>)>,
    ) -> &[(FrameId, Option<CodeAddress>)] {
        let (start, len) = *self.ranges.entry(addr).or_insert_with(|| {
            let resolved = resolve();
            let start = self.frames.len() as u32;
            self.frames.extend(resolved);
            (start, self.frames.len() as u32 - start)
        });
        &self.frames[start as usize..(start + len) as usize]
    }
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
