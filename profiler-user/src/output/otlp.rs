//! A profile as an OTLP profiles request (`ExportProfilesServiceRequest` of
//! `opentelemetry.proto.collector.profiles.v1development`, the dictionary-based schema of
//! OTLP 1.10), built on the official protos' generated types.
//!
//! One `ResourceProfiles` per process, its resource attributes those of OpenTelemetry's
//! semantic conventions (`service.name`, `host.name`, `process.pid`,
//! `process.executable.name`, `process.executable.path`, `container.id`), holding one profile
//! of that process's stacks over the window: sample type `samples`/`count`, period type
//! `cpu`/`nanoseconds` with the nanoseconds each sample stands for, and, where the recording
//! has off-CPU time (`--off-cpu`) and the process waited, a second profile of its waits with
//! sample type `off_cpu`/`nanoseconds` (the OpenTelemetry eBPF profiler's). Threads (in per-thread
//! profiles) are the sample attributes `thread.id` and `thread.name`; the tags of daemon runs
//! that profiled the process are profile attributes. Every request carries its own
//! dictionary (strings, functions, mappings with their build ids, locations with their frame
//! type, stacks), so each request decodes alone.

use std::{
    collections::HashMap,
    time::{SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Location, Mapping, Profile as OtlpProfile,
        ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};

use crate::{
    output::pprof::location_groups,
    profile::{CodeAddress, FrameId, Profile, ProfileFrame},
    symbolize::FrameKind,
};

/// The instrumentation scope's name on every profile.
pub const SCOPE_NAME: &str = "bpfprof";
/// The process labels (set by the agent) that become resource attributes, and
/// the semantic-convention key each becomes; every other label is a profile attribute.
const RESOURCE_LABELS: &[(&str, &str)] = &[
    ("service_name", "service.name"),
    ("host", "host.name"),
    ("executable", "process.executable.path"),
    ("container_id", "container.id"),
];

/// An attribute value, hashable for the dictionary.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Value {
    Str(String),
    Int(i64),
}

impl Value {
    fn any(&self) -> AnyValue {
        AnyValue {
            value: Some(match self {
                Value::Str(s) => any_value::Value::StringValue(s.clone()),
                Value::Int(i) => any_value::Value::IntValue(*i),
            }),
        }
    }
}

/// The request's dictionary, each table holding its zero value at index 0 as the format
/// requires, and the maps that intern into it.
struct Dictionary {
    dict: ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(i32, i32, i32, i64), i32>,
    attributes: HashMap<(String, Value), i32>,
    locations: HashMap<(Vec<FrameId>, Option<CodeAddress>), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    /// Dictionary index of each of the profile's mappings.
    mappings: Vec<i32>,
    /// Dictionary index of each module whose frames have no address.
    modules: HashMap<String, i32>,
}

impl Dictionary {
    fn new(profile: &Profile) -> Dictionary {
        let mut d = Dictionary {
            dict: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Default::default()],
                string_table: vec![String::new()],
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::from([(String::new(), 0)]),
            functions: HashMap::new(),
            attributes: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            mappings: Vec::with_capacity(profile.mappings.len()),
            modules: HashMap::new(),
        };
        for mapping in &profile.mappings {
            let index = d.mapping(&mapping.path, mapping.build_id.as_deref());
            let m = &mut d.dict.mapping_table[index as usize];
            m.memory_start = mapping.start;
            m.memory_limit = mapping.limit;
            m.file_offset = mapping.file_offset;
            d.mappings.push(index);
        }
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.dict.string_table.len() as i32;
        self.dict.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let k = (key.to_string(), value);
        if let Some(&i) = self.attributes.get(&k) {
            return i;
        }
        let i = self.dict.attribute_table.len() as i32;
        let key_strindex = self.string(key);
        self.dict.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(k.1.any()),
            unit_strindex: 0,
        });
        self.attributes.insert(k, i);
        i
    }

    /// A new mapping of `path`, with its build id as an attribute.
    fn mapping(&mut self, path: &str, build_id: Option<&str>) -> i32 {
        let filename_strindex = self.string(path);
        let attribute_indices = build_id
            .map(|b| {
                vec![self.attribute("process.executable.build_id.gnu", Value::Str(b.to_string()))]
            })
            .unwrap_or_default();
        let i = self.dict.mapping_table.len() as i32;
        self.dict.mapping_table.push(Mapping {
            filename_strindex,
            attribute_indices,
            ..Default::default()
        });
        i
    }

    fn function(&mut self, name: &str, file: Option<&str>, start_line: Option<u32>) -> i32 {
        let name_strindex = self.string(name);
        let filename_strindex = file.map_or(0, |f| self.string(f));
        let start_line = start_line.map_or(0, i64::from);
        let key = (name_strindex, name_strindex, filename_strindex, start_line);
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let i = self.dict.function_table.len() as i32;
        self.dict.function_table.push(Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex,
            start_line,
        });
        self.functions.insert(key, i);
        i
    }

    /// The location of a group of frames, outermost first (a code frame and the frames
    /// inlined into it, or one pseudo frame), at `address` where known.
    fn location(
        &mut self,
        profile: &Profile,
        group: &[FrameId],
        address: Option<CodeAddress>,
    ) -> i32 {
        let key = (group.to_vec(), address);
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let mut mapping_index = address.map_or(0, |a| self.mappings[a.mapping_id()]);
        let mut kind = None;
        let mut lines = Vec::with_capacity(group.len());
        // The innermost inlined callee first, the real caller last.
        for &id in group.iter().rev() {
            let line = match &profile.frames[id] {
                ProfileFrame::Code(f) => {
                    if let (0, Some(module)) = (mapping_index, &f.module) {
                        mapping_index = match self.modules.get(&**module) {
                            Some(&m) => m,
                            None => {
                                let m = self.mapping(module, f.build_id.as_deref());
                                self.modules.insert(module.to_string(), m);
                                m
                            }
                        };
                    }
                    kind = Some(f.kind);
                    Line {
                        function_index: self.function(&f.name, f.file.as_deref(), f.start_line),
                        line: f.line.map_or(0, i64::from),
                        column: 0,
                    }
                }
                other => Line {
                    function_index: self.function(other.name(), None, None),
                    line: 0,
                    column: 0,
                },
            };
            lines.push(line);
        }
        // OpenTelemetry's `profile.frame.type` values.
        let frame_type = match kind {
            Some(FrameKind::Kernel) => Some("kernel"),
            Some(FrameKind::User) => Some("native"),
            Some(FrameKind::Runtime(tag)) => Some(tag.otel_frame_type()),
            None => None,
        };
        let attribute_indices = frame_type
            .map(|t| vec![self.attribute("profile.frame.type", Value::Str(t.into()))])
            .unwrap_or_default();
        let i = self.dict.location_table.len() as i32;
        self.dict.location_table.push(Location {
            mapping_index,
            address: address.map_or(0, |a| a.address),
            lines,
            attribute_indices,
        });
        self.locations.insert(key, i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.dict.stack_table.len() as i32;
        self.dict.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }
}

/// Nanoseconds since the epoch of a window's bound (0 before the epoch).
fn unix_nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One process's samples in a window: CPU samples (counts) and time off the CPU
/// (nanoseconds), each for a profile of its own.
#[derive(Default)]
struct ProcessSamples {
    comm: String,
    cpu: Vec<Sample>,
    off_cpu: Vec<Sample>,
}

/// The request for `profile`, recorded from `start` to `end` (an agent's window, a daemon's
/// run): a resource per process (its stacks, the stacks without a process under a resource
/// of the host alone), the dictionary shared by all.
pub fn request(
    profile: &Profile,
    start: SystemTime,
    end: SystemTime,
    host: &str,
) -> ExportProfilesServiceRequest {
    let mut d = Dictionary::new(profile);
    let sample_type = ValueType {
        type_strindex: d.string("samples"),
        unit_strindex: d.string("count"),
    };
    let period_type = ValueType {
        type_strindex: d.string("cpu"),
        unit_strindex: d.string("nanoseconds"),
    };
    // Time off the CPU is a profile of its own, as the OpenTelemetry eBPF profiler sends it:
    // OTLP gives a profile one sample type, and an interval off the CPU is no CPU sample.
    let off_cpu_type = ValueType {
        type_strindex: d.string("off_cpu"),
        unit_strindex: d.string("nanoseconds"),
    };
    let time_unix_nano = unix_nanos(start);
    let duration_nano = unix_nanos(end).saturating_sub(time_unix_nano);
    let period = i64::try_from(profile.meta.sample_nanos()).unwrap_or(i64::MAX);

    // Each process's samples (and its comm), in pid order; `None` holds stacks without one.
    let mut by_pid: std::collections::BTreeMap<Option<u32>, ProcessSamples> = Default::default();
    for stack in &profile.stacks {
        let mut locations: Vec<i32> = Vec::with_capacity(stack.frames.len());
        let mut attribute_indices = Vec::new();
        let mut process = None;
        for (first, group) in location_groups(profile, &stack.frames) {
            match &profile.frames[group[0]] {
                ProfileFrame::Process { pid, comm, .. } => process = Some((*pid, comm.clone())),
                ProfileFrame::Thread { tid, comm, .. } => {
                    attribute_indices.push(d.attribute("thread.id", Value::Int(i64::from(*tid))));
                    if !comm.is_empty() {
                        attribute_indices
                            .push(d.attribute("thread.name", Value::Str(comm.clone())));
                    }
                }
                _ => {
                    let address = stack.addresses.get(first).copied().flatten();
                    locations.push(d.location(profile, &group, address));
                }
            }
        }
        // Leaf first.
        locations.reverse();
        let off_cpu = profile.off_cpu_state(stack).is_some();
        let value = if off_cpu {
            stack.off_cpu_ns
        } else {
            stack.count
        };
        let sample = Sample {
            stack_index: d.stack(locations),
            attribute_indices,
            link_index: 0,
            values: vec![i64::try_from(value).unwrap_or(i64::MAX)],
            timestamps_unix_nano: Vec::new(),
        };
        let (pid, comm) = match process {
            Some((pid, comm)) => (Some(pid), comm),
            None => (None, String::new()),
        };
        let entry = by_pid.entry(pid).or_insert_with(|| ProcessSamples {
            comm,
            ..Default::default()
        });
        if off_cpu {
            entry.off_cpu.push(sample);
        } else {
            entry.cpu.push(sample);
        }
    }

    let mut resource_profiles = Vec::with_capacity(by_pid.len());
    for (pid, ProcessSamples { comm, cpu, off_cpu }) in by_pid {
        let labels = pid
            .and_then(|pid| profile.process_labels.get(&pid))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut attributes = Vec::new();
        let mut add = |key: &str, value: Value| {
            if !attributes.iter().any(|a: &KeyValue| a.key == key) {
                attributes.push(KeyValue {
                    key: key.to_string(),
                    value: Some(value.any()),
                    ..Default::default()
                });
            }
        };
        for (label, key) in RESOURCE_LABELS {
            if let Some((_, v)) = labels.iter().find(|(k, _)| k == label) {
                add(key, Value::Str(v.clone()));
            }
        }
        add("host.name", Value::Str(host.to_string()));
        let mut profile_attributes = Vec::new();
        if let Some(pid) = pid {
            add("process.pid", Value::Int(i64::from(pid)));
            // The executable's file name, as the conventions ask; its comm where unknown.
            let exe = labels
                .iter()
                .find(|(k, _)| k == "executable")
                .and_then(|(_, path)| path.rsplit('/').next())
                .filter(|name| !name.is_empty())
                .unwrap_or(&comm);
            if !exe.is_empty() {
                add("process.executable.name", Value::Str(exe.to_string()));
            }
            // Everything else the process is labelled with: the tags of the daemon runs
            // that profiled it.
            for (key, value) in labels {
                if !RESOURCE_LABELS.iter().any(|(l, _)| l == key) {
                    profile_attributes.push(d.attribute(key, Value::Str(value.clone())));
                }
            }
        }
        // An attribute's key is unique: the run's bare tags (key `tag`) are joined by
        // commas, as the agent labels the tags of daemon runs.
        let mut tags: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for tag in &profile.meta.tags {
            tags.entry(&tag.key).or_default().push(&tag.value);
        }
        for (key, values) in tags {
            profile_attributes.push(d.attribute(key, Value::Str(values.join(","))));
        }
        // The CPU profile always (a window with no CPU sample of a process that only waited
        // still says so), the off-CPU one where the process waited.
        let mut profiles = vec![OtlpProfile {
            sample_type: Some(sample_type),
            samples: cpu,
            time_unix_nano,
            duration_nano,
            period_type: Some(period_type),
            period,
            attribute_indices: profile_attributes.clone(),
            ..Default::default()
        }];
        if !off_cpu.is_empty() {
            profiles.push(OtlpProfile {
                sample_type: Some(off_cpu_type),
                samples: off_cpu,
                time_unix_nano,
                duration_nano,
                attribute_indices: profile_attributes,
                ..Default::default()
            });
        }
        resource_profiles.push(ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(d.dict),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;
    use prost::Message;
    use std::time::Duration;

    /// A profile and the span it was recorded over.
    struct Window {
        start: SystemTime,
        end: SystemTime,
        profile: Profile,
    }

    fn window() -> Window {
        let mut profile = fixture::profile();
        profile.process_labels.insert(
            1234,
            vec![
                ("service_name".into(), "shop".into()),
                ("executable".into(), "/usr/bin/app-bin".into()),
                ("host".into(), "box".into()),
                ("phase".into(), "step7".into()),
            ],
        );
        Window {
            start: UNIX_EPOCH + Duration::from_secs(1000),
            end: UNIX_EPOCH + Duration::from_secs(1010),
            profile,
        }
    }

    /// The string an attribute of the dictionary holds.
    fn attr(d: &ProfilesDictionary, i: i32) -> (String, String) {
        let a = &d.attribute_table[i as usize];
        let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s.clone(),
            Some(any_value::Value::IntValue(i)) => i.to_string(),
            other => panic!("{other:?}"),
        };
        (d.string_table[a.key_strindex as usize].clone(), value)
    }

    #[test]
    fn a_window_decodes_with_its_stacks_counts_and_attributes() {
        let w = window();
        let bytes = request(&w.profile, w.start, w.end, "box").encode_to_vec();
        let req = ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap();
        let d = req.dictionary.as_ref().unwrap();
        // Every table starts with its zero value.
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.function_table[0], Function::default());
        assert_eq!(d.stack_table[0], Stack::default());
        assert_eq!(d.location_table[0], Location::default());
        assert_eq!(d.mapping_table[0], Mapping::default());
        assert_eq!(req.resource_profiles.len(), 1);
        let rp = &req.resource_profiles[0];
        let attrs: HashMap<String, String> = rp
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| {
                let v = match kv.value.as_ref().unwrap().value.as_ref().unwrap() {
                    any_value::Value::StringValue(s) => s.clone(),
                    any_value::Value::IntValue(i) => i.to_string(),
                    other => panic!("{other:?}"),
                };
                (kv.key.clone(), v)
            })
            .collect();
        assert_eq!(attrs["service.name"], "shop");
        assert_eq!(attrs["host.name"], "box");
        assert_eq!(attrs["process.pid"], "1234");
        assert_eq!(attrs["process.executable.name"], "app-bin");
        assert_eq!(attrs["process.executable.path"], "/usr/bin/app-bin");
        assert!(!attrs.contains_key("container.id"));
        let p = &rp.scope_profiles[0].profiles[0];
        assert_eq!(p.time_unix_nano, 1_000_000_000_000);
        assert_eq!(p.duration_nano, 10_000_000_000);
        assert_eq!(p.period, w.profile.meta.sample_nanos() as i64);
        let name = |i: i32| d.string_table[i as usize].as_str();
        let st = p.sample_type.unwrap();
        assert_eq!(
            (name(st.type_strindex), name(st.unit_strindex)),
            ("samples", "count")
        );
        let pt = p.period_type.unwrap();
        assert_eq!(
            (name(pt.type_strindex), name(pt.unit_strindex)),
            ("cpu", "nanoseconds")
        );
        let profile_attrs: Vec<_> = p.attribute_indices.iter().map(|&i| attr(d, i)).collect();
        assert!(profile_attrs.contains(&("phase".into(), "step7".into())));
        assert!(profile_attrs.contains(&("phase".into(), "train".into())));

        // Stacks, leaf first, by function name; the counts add up.
        let total: i64 = p.samples.iter().map(|s| s.values[0]).sum();
        assert_eq!(total as u64, w.profile.total_samples());
        let stacks: Vec<(Vec<String>, i64)> = p
            .samples
            .iter()
            .map(|s| {
                let stack = &d.stack_table[s.stack_index as usize];
                let names = stack
                    .location_indices
                    .iter()
                    .flat_map(|&l| &d.location_table[l as usize].lines)
                    .map(|line| {
                        let f = &d.function_table[line.function_index as usize];
                        name(f.name_strindex).to_string()
                    })
                    .collect();
                (names, s.values[0])
            })
            .collect();
        assert!(stacks.contains(&(
            vec!["leaf_hot".into(), "parent_hot".into(), "main".into()],
            60
        )));
        // Inlined frames share their caller's location, innermost first.
        assert!(stacks.contains(&(
            vec![
                "sys_write".into(),
                "inlined_helper".into(),
                "parent_hot".into(),
                "main".into()
            ],
            8
        )));
        assert!(stacks.contains(&(vec!["deep".into(), "[truncated]".into()], 2)));
        // Kernel frames say so.
        let kernel = d
            .location_table
            .iter()
            .find(|l| {
                l.lines.first().is_some_and(|line| {
                    name(d.function_table[line.function_index as usize].name_strindex)
                        == "sys_write"
                })
            })
            .unwrap();
        assert_eq!(
            attr(d, kernel.attribute_indices[0]),
            ("profile.frame.type".into(), "kernel".into())
        );
    }

    #[test]
    fn waits_are_an_off_cpu_profile_in_nanoseconds_beside_the_cpu_samples() {
        let mut w = window();
        w.profile.meta.off_cpu = Some(crate::sampling::OffCpu {
            preempted: false,
            min_ns: 1000,
        });
        w.profile
            .frames
            .push(ProfileFrame::OffCpu(crate::profile::OffCpuState::Sleeping));
        let off = w.profile.frames.len() - 1;
        // main;parent_cold;[off-cpu: sleeping], 3 waits of 1.5 s in all.
        w.profile.stacks.push(crate::profile::StackCount {
            frames: vec![0, 1, 2, 5, off],
            count: 3,
            off_cpu_ns: 1_500_000_000,
            addresses: Vec::new(),
        });
        let req = request(&w.profile, w.start, w.end, "box");
        let d = req.dictionary.as_ref().unwrap();
        let name = |i: i32| d.string_table[i as usize].as_str();
        let profiles = &req.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let (cpu, waits) = (&profiles[0], &profiles[1]);
        // The CPU profile counts CPU samples only.
        let total: i64 = cpu.samples.iter().map(|s| s.values[0]).sum();
        assert_eq!(total as u64, w.profile.total_samples());
        let st = waits.sample_type.unwrap();
        assert_eq!(
            (name(st.type_strindex), name(st.unit_strindex)),
            ("off_cpu", "nanoseconds")
        );
        assert_eq!(waits.samples.len(), 1);
        assert_eq!(waits.samples[0].values, vec![1_500_000_000]);
        let stack = &d.stack_table[waits.samples[0].stack_index as usize];
        let names: Vec<&str> = stack
            .location_indices
            .iter()
            .flat_map(|&l| &d.location_table[l as usize].lines)
            .map(|line| name(d.function_table[line.function_index as usize].name_strindex))
            .collect();
        assert_eq!(names[1..], ["parent_cold", "main"], "{names:?}");
        assert!(names[0].contains("off-cpu"), "{names:?}");
        // Both carry the window's bounds and the process's attributes.
        assert_eq!(waits.time_unix_nano, cpu.time_unix_nano);
        assert_eq!(waits.duration_nano, cpu.duration_nano);
        assert_eq!(waits.attribute_indices, cpu.attribute_indices);
    }

    #[test]
    fn a_runs_tags_are_profile_attributes_with_one_key_each() {
        let mut w = window();
        w.profile.meta.tags = vec![
            crate::profile::Tag::new("tag", "fwd").unwrap(),
            crate::profile::Tag::new("tag", "step7").unwrap(),
            crate::profile::Tag::new("model", "cnn").unwrap(),
        ];
        let req = request(&w.profile, w.start, w.end, "box");
        let d = req.dictionary.as_ref().unwrap();
        let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
        let attrs: Vec<_> = p.attribute_indices.iter().map(|&i| attr(d, i)).collect();
        assert!(
            attrs.contains(&("tag".into(), "fwd,step7".into())),
            "{attrs:?}"
        );
        assert!(attrs.contains(&("model".into(), "cnn".into())), "{attrs:?}");
        assert_eq!(attrs.iter().filter(|(k, _)| k == "tag").count(), 1);
    }

    #[test]
    fn threads_are_sample_attributes_and_strays_have_a_host_resource() {
        let mut w = window();
        w.profile.frames.push(ProfileFrame::Thread {
            name: "worker (tid 77)".into(),
            tid: 77,
            comm: "worker".into(),
        });
        let thread = w.profile.frames.len() - 1;
        // A stack with a thread under the process, and one with no process at all.
        w.profile.stacks[0].frames.insert(2, thread);
        w.profile.stacks[1].frames.remove(1);
        let req = request(&w.profile, w.start, w.end, "box");
        let d = req.dictionary.as_ref().unwrap();
        assert_eq!(req.resource_profiles.len(), 2);
        let stray = &req.resource_profiles[0];
        assert_eq!(stray.resource.as_ref().unwrap().attributes.len(), 1);
        let samples = &stray.scope_profiles[0].profiles[0].samples;
        assert_eq!(samples.iter().map(|s| s.values[0]).sum::<i64>(), 20);
        let p = &req.resource_profiles[1].scope_profiles[0].profiles[0];
        let s = p.samples.iter().find(|s| s.values[0] == 60).unwrap();
        let attrs: Vec<_> = s.attribute_indices.iter().map(|&i| attr(d, i)).collect();
        assert_eq!(
            attrs,
            vec![
                ("thread.id".to_string(), "77".to_string()),
                ("thread.name".to_string(), "worker".to_string())
            ]
        );
    }
}
