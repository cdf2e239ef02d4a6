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
//! the thread (`tid`, `thread_comm`, the names perf's own pprof converter uses). The profile's
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
};

/// The messages of google/pprof's `proto/profile.proto` (package `perftools.profiles`,
/// <https://github.com/google/pprof/blob/main/proto/profile.proto>), with its field numbers and
/// types; fields bpfprof never sets (`Line.column`, `Profile.doc_url`) are left out, which
/// readers treat as unset. Every `int64` naming a string is an index into `string_table`.
mod proto {
    /// The whole profile.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        /// What each `Sample.value` measures.
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        /// The samples.
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        /// Binaries the locations belong to; `mapping[0]` is taken as the main binary.
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        /// Program locations referenced by samples.
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        /// Functions referenced by locations.
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Every string of the profile; entry 0 must be "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        /// Regexp of frames to drop, with their callees.
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        /// Regexp of frames to keep despite `drop_frames`.
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        /// Start of collection, in nanoseconds since the Unix epoch.
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        /// Length of collection.
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        /// The kind of event between samples.
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        /// Events between samples.
        #[prost(int64, tag = "12")]
        pub period: i64,
        /// Free-form text.
        #[prost(int64, repeated, packed = "true", tag = "13")]
        pub comment: Vec<i64>,
        /// The `type` of the sample value to show by default.
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// A measurement's type and unit.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        /// For example "cpu".
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        /// For example "nanoseconds".
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// Values measured at one stack.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// The stack, leaf first.
        #[prost(uint64, repeated, packed = "true", tag = "1")]
        pub location_id: Vec<u64>,
        /// One value per `Profile.sample_type`.
        #[prost(int64, repeated, packed = "true", tag = "2")]
        pub value: Vec<i64>,
        /// Context of the sample.
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A key with a string or a number.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        /// The key.
        #[prost(int64, tag = "1")]
        pub key: i64,
        /// A string value.
        #[prost(int64, tag = "2")]
        pub str: i64,
        /// A numeric value.
        #[prost(int64, tag = "3")]
        pub num: i64,
        /// The unit of `num`.
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// A binary mapped into the process.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        /// Nonzero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Load address.
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        /// End of the mapped range.
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        /// File offset of `memory_start`.
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        /// The binary's file name.
        #[prost(int64, tag = "5")]
        pub filename: i64,
        /// The binary's build id.
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        /// Locations are symbolized to functions.
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        /// Functions have source file names.
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        /// Lines have line numbers.
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        /// Locations list inlined functions.
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// A program location: one instruction, with the functions inlined at it.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        /// Nonzero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// The mapping, or 0 when none applies.
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        /// The instruction address, if known.
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Innermost inlined callee first, the function really holding the instruction last.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        /// Several symbols share the address (identical code folding).
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// A function and line within a location.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        /// The function.
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        /// The source line, or 0.
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    /// A function.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        /// Nonzero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Human-readable name.
        #[prost(int64, tag = "2")]
        pub name: i64,
        /// Name as the system knows it.
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        /// Source file.
        #[prost(int64, tag = "4")]
        pub filename: i64,
        /// First line of the function.
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

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
    Pseudo,
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
                .map(|a| a.mapping)
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
                        let entry = (frame.is_kernel(), module.as_str(), f.build_id.as_deref());
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
                system_name: name,
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
        let mut mapping_id = address.map_or(0, |a| self.profile_mapping_ids[a.mapping]);
        let mut lines = Vec::with_capacity(group.len());
        let (mut files, mut line_numbers) = (false, false);
        // pprof lists the innermost inlined callee first and the real caller last.
        for &frame_id in group.iter().rev() {
            let (function_id, line) = match &profile.frames[frame_id] {
                ProfileFrame::Code(f) => {
                    if let (0, Some(module)) = (mapping_id, &f.module) {
                        mapping_id = self.module_mapping_ids.get(module).copied().unwrap_or(0);
                    }
                    files |= f.file.is_some();
                    line_numbers |= f.line.is_some();
                    let id = self.function(
                        FunctionClass::Code,
                        &f.name,
                        f.file.as_deref(),
                        f.start_line,
                    );
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
fn location_groups(profile: &Profile, frames: &[FrameId]) -> Vec<(usize, Vec<FrameId>)> {
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
    if measure.period.is_some() {
        sample_type.push(value_type(&mut t.strings, measure.kind, measure.unit));
    }
    let period_type = value_type(&mut t.strings, measure.kind, measure.unit);
    let default_sample_type = sample_type.last().map_or(0, |v| v.r#type);

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
        if let Some(period) = measure.period {
            value.push(to_i64(stack.count.saturating_mul(period)));
        }

        let mut label = tag_labels.clone();
        let mut process = None;
        for &id in &stack.frames {
            match &profile.frames[id] {
                ProfileFrame::Process { name, pid } => {
                    process = Some(name.as_str());
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
mod tests {
    use std::{
        io::Read,
        path::{Path, PathBuf},
        process::Command,
        time::Duration,
    };

    use flate2::read::GzDecoder;
    use serde_json::Value;

    use super::*;
    use crate::output::fixture;

    fn encode(profile: &Profile) -> Vec<u8> {
        let mut out = Vec::new();
        write(profile, &mut out).unwrap();
        out
    }

    fn decode(gz: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        GzDecoder::new(gz).read_to_end(&mut raw).unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    fn s(p: &proto::Profile, i: i64) -> &str {
        &p.string_table[i as usize]
    }

    fn types(p: &proto::Profile) -> Vec<(String, String)> {
        p.sample_type
            .iter()
            .map(|v| (s(p, v.r#type).to_string(), s(p, v.unit).to_string()))
            .collect()
    }

    fn sums(p: &proto::Profile) -> Vec<i64> {
        (0..p.sample_type.len())
            .map(|i| p.sample.iter().map(|x| x.value[i]).sum())
            .collect()
    }

    #[test]
    fn roundtrips_through_prost() {
        let profile = fixture::profile();
        let p = decode(&encode(&profile));
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 5);
        assert_eq!(
            types(&p),
            [
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into())
            ]
        );
        assert_eq!(sums(&p), [100, 100 * 1_001_001]);
        let period_type = p.period_type.as_ref().unwrap();
        assert_eq!(s(&p, period_type.r#type), "cpu");
        assert_eq!(p.period, 1_001_001);
        assert_eq!(s(&p, p.default_sample_type), "cpu");
        assert_eq!(p.duration_nanos, 100_000_000);
        assert!(p.time_nanos > 1_600_000_000_000_000_000);
        for sample in &p.sample {
            let keys: Vec<&str> = sample.label.iter().map(|l| s(&p, l.key)).collect();
            assert_eq!(keys, ["phase", "pid", "comm"]);
            assert_eq!(s(&p, sample.label[0].str), "train");
            assert_eq!(sample.label[1].num, 1234);
            assert_eq!(s(&p, sample.label[2].str), "app");
        }
        // Every referenced id exists, and ids are the 1-based positions.
        for (i, l) in p.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
            assert!(l.mapping_id as usize <= p.mapping.len());
            for line in &l.line {
                assert!((1..=p.function.len() as u64).contains(&line.function_id));
            }
        }
        for sample in &p.sample {
            for id in &sample.location_id {
                assert!((1..=p.location.len() as u64).contains(id));
            }
        }
        let mappings: Vec<&str> = p.mapping.iter().map(|m| s(&p, m.filename)).collect();
        assert_eq!(mappings, ["app", "[kernel]"]);
        assert_eq!(s(&p, p.mapping[0].build_id), "0123abcd");
        assert_eq!(p.mapping[1].build_id, 0);
        assert!(p.mapping[0].has_functions && p.mapping[0].has_filenames);
        assert!(p.mapping[0].has_inline_frames);
        assert!(!p.mapping[1].has_filenames && !p.mapping[1].has_inline_frames);
    }

    #[test]
    fn other_events_and_rates() {
        let mut profile = fixture::profile();
        profile.meta.sampling = Sampling {
            event: Event::Cycles,
            rate: Rate::Period(10_000_000),
            nominal_hz: 250.0,
            fallback: false,
            jitter: true,
        };
        let p = decode(&encode(&profile));
        assert_eq!(
            types(&p),
            [
                ("samples".into(), "count".into()),
                ("cycles".into(), "count".into())
            ]
        );
        assert_eq!(sums(&p), [100, 1_000_000_000]);
        assert_eq!(p.period, 10_000_000);

        profile.meta.sampling = Sampling {
            event: Event::CpuClock,
            rate: Rate::Frequency(1000),
            nominal_hz: 1000.0,
            fallback: false,
            jitter: true,
        };
        let p = decode(&encode(&profile));
        assert_eq!(sums(&p), [100, 100 * 1_000_000]);
        assert_eq!(p.period, 1_000_000);

        // The kernel varies the cycles period to hit a frequency: no cycle count is invented.
        profile.meta.sampling = Sampling {
            event: Event::Cycles,
            rate: Rate::Frequency(99),
            nominal_hz: 99.0,
            fallback: false,
            jitter: true,
        };
        let p = decode(&encode(&profile));
        assert_eq!(types(&p), [("samples".into(), "count".into())]);
        assert_eq!(sums(&p), [100]);
        assert_eq!(s(&p, p.period_type.as_ref().unwrap().r#type), "cycles");
        let comments: Vec<&str> = p.comment.iter().map(|&i| s(&p, i)).collect();
        assert!(comments.iter().any(|c| c.contains("frequency-driven")));
    }

    #[test]
    fn the_pid_comes_from_the_stack_not_the_targets() {
        // Two targets share a name: the pid is still known, from the stack's process frame.
        let mut profile = fixture::profile();
        profile.meta.tags.clear();
        let mut twin = profile.meta.targets[0].clone();
        twin.pid = 77;
        profile.meta.targets.push(twin);
        profile.meta.duration = Duration::ZERO;
        let p = decode(&encode(&profile));
        for sample in &p.sample {
            let keys: Vec<&str> = sample.label.iter().map(|l| s(&p, l.key)).collect();
            assert_eq!(keys, ["pid", "comm"]);
            assert_eq!(sample.label[0].num, 1234);
        }
    }

    #[test]
    fn per_thread_samples_get_tid_and_thread_name_labels() {
        let mut profile = fixture::profile();
        profile.frames.push(ProfileFrame::Thread {
            name: "worker (tid 1240)".into(),
            tid: 1240,
            comm: "worker".into(),
        });
        let thread = profile.frames.len() - 1;
        for stack in &mut profile.stacks {
            stack.frames.insert(2, thread);
        }
        let p = decode(&encode(&profile));
        for sample in &p.sample {
            let labels: Vec<(&str, &str, i64)> = sample
                .label
                .iter()
                .map(|l| (s(&p, l.key), s(&p, l.str), l.num))
                .collect();
            assert!(labels.contains(&("tid", "", 1240)), "{labels:?}");
            assert!(labels.contains(&("thread_comm", "worker", 0)), "{labels:?}");
        }
    }

    #[test]
    fn locations_keep_real_addresses_and_mappings() {
        use crate::profile::{CodeAddress, Mapping};
        let mut profile = fixture::profile();
        profile.mappings = vec![
            Mapping {
                start: 0x7f00_0000_0000,
                limit: 0x7f00_0000_8000,
                file_offset: 0x1000,
                path: "/usr/lib/libfoo.so.1".into(),
                build_id: Some("feed".into()),
                pid: Some(1234),
                executable: false,
            },
            Mapping {
                start: 0x5555_0000_1000,
                limit: 0x5555_0000_9000,
                file_offset: 0x1000,
                path: "/opt/app/bin/app".into(),
                build_id: Some("0123abcd".into()),
                pid: Some(1234),
                executable: true,
            },
        ];
        let at = |address: u64, mapping: usize| Some(CodeAddress { address, mapping });
        // tag, app, main, parent_hot, leaf_hot: the two code callers in the app, the leaf in
        // the library, at two addresses that must stay two locations.
        profile.stacks[0].addresses = vec![
            None,
            None,
            at(0x5555_0000_1100, 1),
            at(0x5555_0000_1200, 1),
            at(0x7f00_0000_0010, 0),
        ];
        let mut other = profile.stacks[0].clone();
        other.addresses[4] = at(0x7f00_0000_0020, 0);
        other.count = 5;
        profile.stacks.push(other);
        let p = decode(&encode(&profile));

        // The executable comes first: pprof takes it as the main binary.
        let files: Vec<&str> = p.mapping.iter().map(|m| s(&p, m.filename)).collect();
        assert_eq!(files[..2], ["/opt/app/bin/app", "/usr/lib/libfoo.so.1"]);
        let app = &p.mapping[0];
        assert_eq!(
            (app.memory_start, app.memory_limit, app.file_offset),
            (0x5555_0000_1000, 0x5555_0000_9000, 0x1000)
        );
        assert_eq!(s(&p, app.build_id), "0123abcd");
        let leaf_addresses: Vec<(u64, u64)> = p
            .sample
            .iter()
            .map(|sample| &p.location[sample.location_id[0] as usize - 1])
            .filter(|l| l.address != 0)
            .map(|l| (l.address, l.mapping_id))
            .collect();
        assert_eq!(
            leaf_addresses,
            [(0x7f00_0000_0010, 2), (0x7f00_0000_0020, 2)]
        );
        let main = p
            .location
            .iter()
            .find(|l| l.address == 0x5555_0000_1100)
            .unwrap();
        assert_eq!(main.mapping_id, 1);
        // Frames without addresses keep their module's mapping, without a range.
        let cold = p
            .location
            .iter()
            .find(|l| {
                l.line.iter().any(|line| {
                    s(&p, p.function[line.function_id as usize - 1].name) == "leaf_cold"
                })
            })
            .unwrap();
        assert_eq!(cold.address, 0);
        assert_eq!(
            s(&p, p.mapping[cold.mapping_id as usize - 1].filename),
            "app"
        );
    }

    /// Where `cargo xtask setup` installs the JavaScript validators.
    fn validators() -> PathBuf {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        workspace.join("target/validators/node_modules")
    }

    /// Decodes with DataDog's `pprof-format` (an independent reader) and summarizes as JSON.
    const READER: &str = r#"
const fs = require("fs");
const zlib = require("zlib");
const { Profile } = require("pprof-format");
const p = Profile.decode(zlib.gunzipSync(fs.readFileSync(process.env.PPROF_PATH)));
const str = (i) => p.stringTable.strings[Number(i)];
const fns = new Map(p.function.map((f) => [Number(f.id), f]));
const locs = new Map(p.location.map((l) => [Number(l.id), l]));
const names = (id) => locs.get(Number(id)).line.map((l) => str(fns.get(Number(l.functionId)).name));
console.log(JSON.stringify({
  string0: p.stringTable.strings[0],
  samples: p.sample.length,
  value_sums: p.sampleType.map((_, i) => p.sample.reduce((a, s) => a + Number(s.value[i]), 0)),
  sample_types: p.sampleType.map((t) => [str(t.type), str(t.unit)]),
  period_type: [str(p.periodType.type), str(p.periodType.unit)],
  period: Number(p.period),
  duration_nanos: Number(p.durationNanos),
  stacks: p.sample.map((s) => ({
    count: Number(s.value[0]),
    leaf: names(s.locationId[0]),
    locations: s.locationId.map(names),
    labels: s.label.map((l) => ({ key: str(l.key), str: str(l.str), num: Number(l.num) })),
  })),
  functions: p.function.map((f) => str(f.name)),
  mappings: p.mapping.map((m) => str(m.filename)),
  comments: p.comment.map(str),
}));
"#;

    #[test]
    fn independent_reader_decodes_it() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        let modules = validators();
        let node_ok = Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let installed = modules.join("pprof-format/package.json").is_file();
        if !node_ok || !installed {
            let why = if node_ok {
                format!("pprof-format is not installed under {}", modules.display())
            } else {
                "node is not installed".to_string()
            };
            assert!(
                !ci,
                "{why}, and CI=true: run `cargo xtask setup` to install the validators"
            );
            eprintln!("skipping: {why} (run `cargo xtask setup`)");
            return;
        }

        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = std::env::temp_dir().join(format!(
            "bpfprof-pprof-test-{}-{nanos}.pb.gz",
            std::process::id()
        ));
        std::fs::write(&path, encode(&fixture::profile())).unwrap();
        let out = Command::new("node")
            .arg("-e")
            .arg(READER)
            .env("NODE_PATH", &modules)
            .env("PPROF_PATH", &path)
            .output();
        let _ = std::fs::remove_file(&path);
        let out = out.expect("running node");
        assert!(
            out.status.success(),
            "pprof-format failed to read the profile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("the reader prints JSON");

        assert_eq!(v["string0"], "");
        assert_eq!(v["samples"], 5);
        assert_eq!(v["value_sums"], serde_json::json!([100, 100 * 1_001_001]));
        assert_eq!(
            v["sample_types"],
            serde_json::json!([["samples", "count"], ["cpu", "nanoseconds"]])
        );
        assert_eq!(v["period_type"], serde_json::json!(["cpu", "nanoseconds"]));
        assert_eq!(v["period"], 1_001_001);
        assert_eq!(v["duration_nanos"], 100_000_000);

        let stacks = v["stacks"].as_array().unwrap();
        let leaf_total = |name: &str| -> u64 {
            stacks
                .iter()
                .filter(|s| s["leaf"][0] == name)
                .map(|s| s["count"].as_u64().unwrap())
                .sum()
        };
        assert_eq!(leaf_total("leaf_hot"), 70);
        assert_eq!(leaf_total("leaf_cold"), 20);
        assert_eq!(leaf_total("sys_write"), 8);
        assert_eq!(leaf_total("deep"), 2);

        // The kernel sample: sys_write, then one location holding the inlined helper and the
        // function it was inlined into, then main and the process at the root.
        let kernel = stacks.iter().find(|s| s["leaf"][0] == "sys_write").unwrap();
        assert_eq!(
            kernel["locations"],
            serde_json::json!([
                ["sys_write"],
                ["inlined_helper", "parent_hot"],
                ["main"],
                ["app"]
            ])
        );
        // Recursion keeps both frames; the truncated stack is rooted at its marker.
        let recursive = stacks.iter().find(|s| s["count"] == 10).unwrap();
        assert_eq!(
            recursive["locations"],
            serde_json::json!([["leaf_hot"], ["recurse"], ["recurse"], ["main"], ["app"]])
        );
        let truncated = stacks.iter().find(|s| s["leaf"][0] == "deep").unwrap();
        assert_eq!(
            truncated["locations"],
            serde_json::json!([["deep"], ["[truncated]"], ["app"]])
        );

        for stack in stacks {
            let labels = stack["labels"].as_array().unwrap();
            assert!(
                labels
                    .iter()
                    .any(|l| l["key"] == "phase" && l["str"] == "train"),
                "{stack}"
            );
            assert!(labels.iter().any(|l| l["key"] == "pid" && l["num"] == 1234));
            assert!(labels
                .iter()
                .any(|l| l["key"] == "comm" && l["str"] == "app"));
            // Tags are labels, never frames.
            let frames = stack["locations"].to_string();
            assert!(!frames.contains("phase"), "{frames}");
        }

        let functions: Vec<&str> = v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert!(functions.contains(&"[truncated]"));
        assert_eq!(v["mappings"], serde_json::json!(["app", "[kernel]"]));

        let comments: Vec<&str> = v["comments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        let mentions = |needle: &str| comments.iter().any(|c| c.contains(needle));
        assert!(mentions("cpu-clock"), "{comments:?}");
        assert!(mentions("100 recorded of 100 seen"), "{comments:?}");
        assert!(mentions("truncated stacks: 2"), "{comments:?}");
        assert!(mentions("bpf program cost: unknown"), "{comments:?}");
        assert!(mentions("peak RSS"), "{comments:?}");
        assert!(mentions("phase=train"), "{comments:?}");
        assert!(mentions("ended: completed"), "{comments:?}");
    }
}
