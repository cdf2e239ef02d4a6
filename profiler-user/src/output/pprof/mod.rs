//! pprof output: a gzipped `profile.proto` as `go tool pprof`, pprof.me and Grafana read it.
//!
//! Each stack becomes one sample, leaf first. Code frames become functions and locations, with
//! a function's inlined callees folded into the location of the instruction that holds them;
//! process, thread and `[truncated]` frames become pseudo-functions at the root end, as the
//! folded output shows them. Locations carry the sampled address (a return address minus one
//! for callers, inside the call) and mappings the real address range, file offset, full path
//! and build id, so that `pprof -disasm` and `-addresses` work where the binary is.
//! Tags are sample labels instead of frames, because pprof filters and groups by labels
//! (`-tagfocus`, `-tagroot`); so are the process (`pid`, `comm`) and, in per-thread profiles,
//! the thread (`tid`, `thread_comm`, the names perf's own pprof converter uses), and each
//! process's own labels where the profile has them (the agent's `service_name`, ...). The profile's
//! comments state its cost and completeness, because a pprof file is often read far from the
//! run that made it.

use std::{
    collections::HashMap,
    io::{self, Write},
    time::{SystemTime, UNIX_EPOCH},
};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use crate::{
    profile::{CodeAddress, FrameId, Profile, ProfileFrame, RunEnd},
    sampling::{Event, Rate, Sampling},
    symbolize::FrameKind,
};

mod proto;

/// Writes `profile` as a gzipped pprof `profile.proto`.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let bytes = build(profile, SystemTime::now()).encode_to_vec();
    let mut gz = GzEncoder::new(w, Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}

/// What the second sample value measures, and the period it is counted in.
struct Measure {
    kind: &'static str,
    unit: &'static str,
    /// Events per sample; `None` when the kernel varies it (cycles at a frequency).
    period: Option<u64>,
}

impl Measure {
    fn of(sampling: &Sampling) -> Measure {
        match sampling.event {
            Event::CpuClock => {
                let ns = match sampling.rate {
                    Rate::Period(ns) => ns,
                    // The kernel adjusts the period to hit the frequency: the nominal rate is
                    // the best estimate of the time each sample stands for.
                    Rate::Frequency(hz) => {
                        let hz = if sampling.nominal_hz > 0.0 {
                            sampling.nominal_hz
                        } else {
                            hz as f64
                        };
                        if hz > 0.0 {
                            (1e9 / hz).round() as u64
                        } else {
                            0
                        }
                    }
                };
                Measure {
                    kind: "cpu",
                    unit: "nanoseconds",
                    period: (ns > 0).then_some(ns),
                }
            }
            Event::Cycles => Measure {
                kind: "cycles",
                unit: "count",
                period: Some(sampling.period()).filter(|p| *p > 0),
            },
        }
    }
}

/// The string table, deduplicated, with "" at index 0 as the format requires.
struct Strings {
    table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            table: vec![String::new()],
            ids: HashMap::from([(String::new(), 0)]),
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(id) = self.ids.get(s) {
            return *id;
        }
        let id = self.table.len() as i64;
        self.table.push(s.to_string());
        self.ids.insert(s.to_string(), id);
        id
    }
}

/// Whether a function stands for code or for one of bpfprof's root frames, so that a code
/// function that happens to share a process's name stays apart from it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum FunctionClass {
    Code,
    /// A runtime's function (Python's), named by its code object (not a native symbol).
    Runtime(profiler_common::RuntimeTag),
    Pseudo,
}

/// The name pprof keeps a function by (`system_name`). pprof re-demangles every function whose
/// system name equals its name, and takes a name with `<`, `>`, `[` or `]` for a demangled C++
/// one whose template arguments and parameters it strips: Python's `<module>` became an empty
/// name in `-top` and `-lines`. Names bpfprof made (Python code objects, pseudo frames) get a
/// system name of their own, so pprof shows them as written; native symbols keep theirs.
fn system_name(class: FunctionClass, name: &str, file: Option<&str>) -> String {
    match (class, file) {
        (FunctionClass::Code, _) => name.to_string(),
        (FunctionClass::Runtime(_), Some(file)) => format!("{file}:{name}"),
        (FunctionClass::Runtime(tag), None) => format!("{}:{name}", tag.name()),
        (FunctionClass::Pseudo, _) => format!("bpfprof:{name}"),
    }
}

/// Everything but the samples, interned as the samples are built.
struct Tables {
    strings: Strings,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(FunctionClass, i64, i64), u64>,
    mappings: Vec<proto::Mapping>,
    /// pprof mapping id of each of the profile's mappings.
    profile_mapping_ids: Vec<u64>,
    /// pprof mapping id of each module whose frames have no address.
    module_mapping_ids: HashMap<String, u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<(Vec<FrameId>, Option<CodeAddress>), u64>,
}

impl Tables {
    /// Creates the mappings: the profile's own (real ranges, offsets, full paths and build
    /// ids), then one per module for frames without an address. pprof takes `mapping[0]` as
    /// the main binary, so executables come first (the busiest stack's one first), then
    /// libraries, and the kernel last.
    fn new(profile: &Profile) -> Tables {
        let mut strings = Strings::new();
        let mut order: Vec<usize> = (0..profile.mappings.len()).collect();
        let busiest = profile.stacks.first().and_then(|stack| {
            stack
                .addresses
                .iter()
                .flatten()
                .map(|a| a.mapping_id())
                .find(|&m| profile.mappings[m].executable)
        });
        order.sort_by_key(|&m| {
            let mapping = &profile.mappings[m];
            (
                !mapping.executable,
                Some(m) != busiest,
                mapping.pid.is_none(),
            )
        });
        let mut mappings = Vec::new();
        let mut profile_mapping_ids = vec![0; profile.mappings.len()];
        for m in order {
            let mapping = &profile.mappings[m];
            let id = mappings.len() as u64 + 1;
            mappings.push(proto::Mapping {
                id,
                memory_start: mapping.start,
                memory_limit: mapping.limit,
                file_offset: mapping.file_offset,
                filename: strings.id(&mapping.path),
                build_id: mapping.build_id.as_deref().map_or(0, |b| strings.id(b)),
                // Symbolized already: pprof must not try again.
                has_functions: true,
                ..Default::default()
            });
            profile_mapping_ids[m] = id;
        }

        let mut modules: Vec<(bool, &str, Option<&str>)> = Vec::new();
        for stack in &profile.stacks {
            for (i, &frame_id) in stack.frames.iter().enumerate() {
                let frame = &profile.frames[frame_id];
                if let ProfileFrame::Code(f) = frame {
                    let addressed = stack.addresses.get(i).is_some_and(Option::is_some);
                    if let (false, Some(module)) = (addressed, &f.module) {
                        let entry = (frame.is_kernel(), &**module, f.build_id.as_deref());
                        if !modules.iter().any(|m| m.1 == entry.1) {
                            modules.push(entry);
                        }
                    }
                }
            }
        }
        modules.sort_by_key(|(kernel, _, _)| *kernel);
        let mut module_mapping_ids = HashMap::new();
        for (_, module, build_id) in modules {
            let id = mappings.len() as u64 + 1;
            // No address was kept for these frames, so the range stays unknown (0..0).
            mappings.push(proto::Mapping {
                id,
                filename: strings.id(module),
                build_id: build_id.map_or(0, |b| strings.id(b)),
                has_functions: true,
                ..Default::default()
            });
            module_mapping_ids.insert(module.to_string(), id);
        }
        Tables {
            strings,
            functions: Vec::new(),
            function_ids: HashMap::new(),
            mappings,
            profile_mapping_ids,
            module_mapping_ids,
            locations: Vec::new(),
            location_ids: HashMap::new(),
        }
    }

    fn function(
        &mut self,
        class: FunctionClass,
        name: &str,
        file: Option<&str>,
        start_line: Option<u32>,
    ) -> u64 {
        let system_name = system_name(class, name, file);
        let system_name = self.strings.id(&system_name);
        let name = self.strings.id(name);
        let filename = file.map_or(0, |f| self.strings.id(f));
        let next = self.functions.len() as u64 + 1;
        let id = *self
            .function_ids
            .entry((class, name, filename))
            .or_insert(next);
        if id == next {
            self.functions.push(proto::Function {
                id,
                name,
                system_name,
                filename,
                start_line: start_line.map_or(0, i64::from),
            });
        }
        id
    }

    /// The location of a group of frames, outermost first: either one pseudo frame, or a code
    /// frame followed by the frames inlined into it, at `address` where it is known.
    fn location(
        &mut self,
        profile: &Profile,
        group: &[FrameId],
        address: Option<CodeAddress>,
    ) -> u64 {
        let key = (group.to_vec(), address);
        if let Some(id) = self.location_ids.get(&key) {
            return *id;
        }
        let mut mapping_id = address.map_or(0, |a| self.profile_mapping_ids[a.mapping_id()]);
        let mut lines = Vec::with_capacity(group.len());
        let (mut files, mut line_numbers) = (false, false);
        // pprof lists the innermost inlined callee first and the real caller last.
        for &frame_id in group.iter().rev() {
            let (function_id, line) = match &profile.frames[frame_id] {
                ProfileFrame::Code(f) => {
                    if let (0, Some(module)) = (mapping_id, &f.module) {
                        mapping_id = self.module_mapping_ids.get(&**module).copied().unwrap_or(0);
                    }
                    files |= f.file.is_some();
                    line_numbers |= f.line.is_some();
                    let class = match f.kind {
                        FrameKind::Runtime(tag) => FunctionClass::Runtime(tag),
                        _ => FunctionClass::Code,
                    };
                    let id = self.function(class, &f.name, f.file.as_deref(), f.start_line);
                    (id, f.line.map_or(0, i64::from))
                }
                other => (
                    self.function(FunctionClass::Pseudo, other.name(), None, None),
                    0,
                ),
            };
            lines.push(proto::Line { function_id, line });
        }
        if mapping_id > 0 {
            let mapping = &mut self.mappings[mapping_id as usize - 1];
            mapping.has_filenames |= files;
            mapping.has_line_numbers |= line_numbers;
            mapping.has_inline_frames |= lines.len() > 1;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: address.map_or(0, |a| a.address),
            line: lines,
            ..Default::default()
        });
        self.location_ids.insert(key, id);
        id
    }
}

/// Splits a root-first stack into location groups, root first, leaving tags out (they are
/// labels), each with the index in the stack of its first frame. An inlined frame joins the
/// group before it when both come from the same module, which is how the symbolizer emits a
/// function and what was inlined into it.
pub fn location_groups(profile: &Profile, frames: &[FrameId]) -> Vec<(usize, Vec<FrameId>)> {
    let mut groups: Vec<(usize, Vec<FrameId>)> = Vec::new();
    for (i, &id) in frames.iter().enumerate() {
        match &profile.frames[id] {
            ProfileFrame::Tag(_) => continue,
            ProfileFrame::Code(f) if f.inlined => {
                let joins = groups
                    .last()
                    .and_then(|g| g.1.first())
                    .is_some_and(|&first| {
                        matches!(&profile.frames[first], ProfileFrame::Code(caller)
                        if caller.module == f.module && caller.kind == f.kind)
                    });
                if joins {
                    groups.last_mut().expect("checked above").1.push(id);
                } else {
                    groups.push((i, vec![id]));
                }
            }
            _ => groups.push((i, vec![id])),
        }
    }
    groups
}

fn build(profile: &Profile, now: SystemTime) -> proto::Profile {
    let meta = &profile.meta;
    let measure = Measure::of(&meta.sampling);
    let mut t = Tables::new(profile);

    let mut sample_type = vec![value_type(&mut t.strings, "samples", "count")];
    // With off-CPU time every sample has the same values: count (samples, or intervals off
    // the CPU), CPU time, off-CPU time, and in wall mode their sum, which pprof shows first.
    let off_cpu = meta.off_cpu;
    if off_cpu.is_some() {
        sample_type.push(value_type(&mut t.strings, "cpu", "nanoseconds"));
        sample_type.push(value_type(&mut t.strings, "off_cpu", "nanoseconds"));
        if off_cpu.is_some_and(|o| o.preempted) {
            sample_type.push(value_type(&mut t.strings, "wall", "nanoseconds"));
        }
    } else if measure.period.is_some() {
        sample_type.push(value_type(&mut t.strings, measure.kind, measure.unit));
    }
    let period_type = value_type(&mut t.strings, measure.kind, measure.unit);
    let default_sample_type = sample_type.last().map_or(0, |v| v.r#type);
    let state_key = t.strings.id("state");

    let tag_labels: Vec<proto::Label> = meta
        .tags
        .iter()
        .map(|tag| proto::Label {
            key: t.strings.id(&tag.key),
            str: t.strings.id(&tag.value),
            ..Default::default()
        })
        .collect();
    let pid_key = t.strings.id("pid");
    let comm_key = t.strings.id("comm");
    // The label names of perf's own pprof converter (perf_data_converter).
    let tid_key = t.strings.id("tid");
    let thread_comm_key = t.strings.id("thread_comm");
    let task_key = t.strings.id("task");

    let mut samples = Vec::with_capacity(profile.stacks.len());
    for stack in &profile.stacks {
        let mut location_id: Vec<u64> = location_groups(profile, &stack.frames)
            .iter()
            .map(|(first, group)| {
                let address = stack.addresses.get(*first).copied().flatten();
                t.location(profile, group, address)
            })
            .collect();
        location_id.reverse();

        let mut value = vec![to_i64(stack.count)];
        let state = profile.off_cpu_state(stack);
        if let Some(off_cpu) = off_cpu {
            let nanos = profile.stack_nanos(stack);
            let (cpu, off) = if state.is_some() {
                (0, nanos)
            } else {
                (nanos, 0)
            };
            value.push(to_i64(cpu));
            value.push(to_i64(off));
            if off_cpu.preempted {
                value.push(to_i64(nanos));
            }
        } else if let Some(period) = measure.period {
            value.push(to_i64(stack.count.saturating_mul(period)));
        }

        let mut label = tag_labels.clone();
        if let Some(state) = state {
            // Why the thread waited, as the scheduler saw it: `-tagfocus=state=disk`.
            label.push(proto::Label {
                key: state_key,
                str: t.strings.id(state.name()),
                ..Default::default()
            });
        }
        let mut process = None;
        for &id in &stack.frames {
            match &profile.frames[id] {
                ProfileFrame::Process { comm, pid, .. } => {
                    process = Some(comm.as_str());
                    // The process's own labels (the agent's service_name, executable, ...).
                    for (key, value) in profile.process_labels.get(pid).into_iter().flatten() {
                        label.push(proto::Label {
                            key: t.strings.id(key),
                            str: t.strings.id(value),
                            ..Default::default()
                        });
                    }
                    label.push(proto::Label {
                        key: pid_key,
                        num: i64::from(*pid),
                        ..Default::default()
                    });
                }
                ProfileFrame::Thread { tid, comm, .. } => {
                    label.push(proto::Label {
                        key: tid_key,
                        num: i64::from(*tid),
                        ..Default::default()
                    });
                    if !comm.is_empty() {
                        label.push(proto::Label {
                            key: thread_comm_key,
                            str: t.strings.id(comm),
                            ..Default::default()
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(comm) = process {
            label.push(proto::Label {
                key: comm_key,
                str: t.strings.id(comm),
                ..Default::default()
            });
        }
        if let Some(task) = task_of(profile, &stack.frames) {
            // The asyncio task the sample ran in (CPython 3.14+): `-tagfocus=task=fetch-3`.
            label.push(proto::Label {
                key: task_key,
                str: t.strings.id(task),
                ..Default::default()
            });
        }
        samples.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    let comment = comments(profile, &measure)
        .iter()
        .map(|c| t.strings.id(c))
        .collect();
    let duration_nanos = to_i64(u64::try_from(meta.duration.as_nanos()).unwrap_or(u64::MAX));
    let start = now.checked_sub(meta.duration).unwrap_or(now);
    let time_nanos = start.duration_since(UNIX_EPOCH).map_or(0, |d| {
        to_i64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    });

    proto::Profile {
        sample_type,
        sample: samples,
        mapping: t.mappings,
        location: t.locations,
        function: t.functions,
        string_table: t.strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos,
        duration_nanos,
        period_type: Some(period_type),
        period: to_i64(measure.period.unwrap_or(0)),
        comment,
        default_sample_type,
    }
}

fn value_type(strings: &mut Strings, kind: &str, unit: &str) -> proto::ValueType {
    proto::ValueType {
        r#type: strings.id(kind),
        unit: strings.id(unit),
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The profile's cost and completeness, one statement a comment.
fn comments(profile: &Profile, measure: &Measure) -> Vec<String> {
    let meta = &profile.meta;
    let mut c = vec![format!("bpfprof: {}", meta.sampling.describe())];
    if measure.period.is_none() {
        c.push(format!(
            "{} per sample vary (frequency-driven): only sample counts are recorded",
            measure.kind
        ));
    }
    c.push(format!(
        "samples: {} recorded of {} seen, over {:.3} s",
        profile.total_samples(),
        meta.samples_seen,
        meta.duration.as_secs_f64()
    ));
    let losses = meta.losses.nonzero();
    if losses.is_empty() {
        c.push("lost or incomplete: none".to_string());
    }
    for (what, n) in losses {
        c.push(format!("lost or incomplete: {what}: {n} samples"));
    }
    c.push(format!(
        "stack limit: {} frames (deeper stacks keep their leaf-most frames under [truncated])",
        meta.max_stack_length
    ));
    match meta.cost.bpf_ns_per_run() {
        Some(ns) => c.push(format!(
            "bpf program cost: {ns:.0} ns per run over {} runs",
            meta.cost.bpf_run_count.unwrap_or(0)
        )),
        None => c.push(
            "bpf program cost: unknown (sysctl kernel.bpf_stats_enabled was off)".to_string(),
        ),
    }
    let rss_mib = meta.cost.profiler_peak_rss_bytes as f64 / (1024.0 * 1024.0);
    c.push(match meta.cost.scope {
        crate::profile::CostScope::Process => format!(
            "profiler cost: {:.3} s CPU, peak RSS {rss_mib:.1} MiB",
            meta.cost.profiler_cpu_secs
        ),
        crate::profile::CostScope::DaemonRun => format!(
            "profiler cost: {:.3} s CPU of the daemon on this run, daemon peak RSS {rss_mib:.1} MiB",
            meta.cost.profiler_cpu_secs
        ),
    });
    for target in &meta.targets {
        c.push(format!("target: {} (pid {})", target.comm, target.pid));
    }
    if !meta.tags.is_empty() {
        c.push(format!("tags: {}", meta.tag_list(" ")));
    }
    c.push(format!(
        "ended: {}",
        match meta.end {
            RunEnd::Completed => "completed",
            RunEnd::TargetExited => "every target exited",
            RunEnd::Interrupted => "interrupted",
        }
    ));
    c
}

#[cfg(test)]
mod tests;

/// The name of the asyncio task a stack (frame ids, root first) ran in: its innermost
/// `[task NAME] COROUTINE` frame's NAME (the frames CPython 3.14+'s async stacks put in place
/// of the event loop's).
fn task_of<'a>(profile: &'a Profile, frames: &[usize]) -> Option<&'a str> {
    frames
        .iter()
        .rev()
        .find_map(|&id| match &profile.frames[id] {
            ProfileFrame::Code(f) if matches!(f.kind, crate::symbolize::FrameKind::Runtime(_)) => {
                let rest = f.name.strip_prefix("[task ")?;
                rest.rsplit_once(']').map(|(name, _)| name)
            }
            _ => None,
        })
}
