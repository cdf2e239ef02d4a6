//! speedscope's JSON file format (<https://www.speedscope.app/file-format-schema.json>): one
//! sampled profile per process, or per thread in per-thread profiles.
//!
//! Choices, made for how speedscope shows things:
//! - Weights are CPU time in nanoseconds (unit `nanoseconds`): samples times the time one
//!   sample stands for (the cpu-clock period, else the time between samples at the nominal
//!   rate), so speedscope shows seconds, as it does for the same profile read from pprof.
//! - The process, thread and tag frames are not in the stacks: they name the profile instead
//!   (`app [phase=train]`), since speedscope lists profiles by name and the extra roots would
//!   only repeat it in every stack.
//! - A frame's name is its label (`name (file.c:12)` where lines are kept). Its `file` is the
//!   source file where debug info names one, else the module (`libc.so.6`, `[kernel]`): kernel
//!   frames keep their plain names and show as kernel code in speedscope's frame details.
//! - Without a timeline, identical stacks are one sample with their count as weight, in the
//!   order of their frame names, so that the "Time Order" view (there is no time order to
//!   keep) reads as a flame graph too.
//! - With a timeline (`--timeline`, or a `.trace.json` beside it), the samples come in the
//!   order they were taken, consecutive samples of one stack merged into one with their summed
//!   weight, so that "Time Order" shows the program's phases left to right (the samples of a
//!   process's threads interleave unless `--per-thread` gives each thread its profile). What
//!   has no time (samples whose time was lost, counted as such; off-CPU time) follows, as
//!   without a timeline, so that totals match the other formats.

use std::{
    collections::HashMap,
    io::{self, Write},
};

use serde::Serialize;

use crate::{
    profile::{FrameId, Profile, ProfileFrame},
    symbolize::FrameKind,
};

/// The unit of every weight.
const UNIT: &str = "nanoseconds";

/// The `$schema` that speedscope recognises its own format by.
const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File {
    #[serde(rename = "$schema")]
    schema: &'static str,
    name: String,
    exporter: String,
    active_profile_index: usize,
    shared: Shared,
    profiles: Vec<SampledProfile>,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct Frame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// The stacks of one process (or thread), before frames get their speedscope indices.
#[derive(Default)]
struct Group {
    process: Option<FrameId>,
    thread: Option<FrameId>,
    tags: Vec<FrameId>,
    /// Samples that have a time, in time order, with their weights.
    timed: Vec<(Vec<FrameId>, u64)>,
    /// The rest, with their weights.
    stacks: Vec<(Vec<FrameId>, u64)>,
}

impl Group {
    fn total(&self) -> u64 {
        self.timed.iter().chain(&self.stacks).map(|(_, n)| n).sum()
    }

    fn name(&self, labels: &[String]) -> String {
        let mut name = self
            .process
            .map_or_else(|| "unknown process".to_string(), |id| labels[id].clone());
        if let Some(thread) = self.thread {
            name = format!("{name}: {}", labels[thread]);
        }
        for &tag in &self.tags {
            name.push(' ');
            name.push_str(&labels[tag]);
        }
        name
    }
}

/// Writes `profile` as a speedscope JSON file.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let labels: Vec<String> = profile.frames.iter().map(ProfileFrame::label).collect();
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: HashMap<(Option<FrameId>, Option<FrameId>), usize> = HashMap::new();
    // Samples of each stack that the timeline places in time.
    let mut timed_count = vec![0u64; profile.stacks.len()];
    let timeline = profile
        .timeline
        .as_ref()
        .map_or(&[][..], |t| &t.samples[..]);
    for sample in timeline {
        if let Some(n) = timed_count.get_mut(sample.stack) {
            *n += 1;
        }
    }
    // Each stack's group and code frames, for placing the timeline's samples.
    let mut placed: Vec<(usize, Vec<FrameId>)> = Vec::with_capacity(profile.stacks.len());
    let period = profile.meta.sample_nanos();
    for (index, stack) in profile.stacks.iter().enumerate() {
        let (mut process, mut thread, mut tags, mut code) = (None, None, Vec::new(), Vec::new());
        for &id in &stack.frames {
            match &profile.frames[id] {
                ProfileFrame::Process { .. } => process = Some(id),
                ProfileFrame::Thread { .. } => thread = Some(id),
                ProfileFrame::Tag(_) => tags.push(id),
                ProfileFrame::Code(_) | ProfileFrame::Truncated | ProfileFrame::OffCpu(_) => {
                    code.push(id)
                }
            }
        }
        let group_index = *group_of.entry((process, thread)).or_insert_with(|| {
            groups.push(Group {
                process,
                thread,
                ..Group::default()
            });
            groups.len() - 1
        });
        let group = &mut groups[group_index];
        for tag in tags {
            if !group.tags.contains(&tag) {
                group.tags.push(tag);
            }
        }
        // Nanoseconds: CPU samples times the period, off-CPU stacks their time; those the
        // timeline places in time are written in its order below.
        let untimed = profile
            .stack_nanos(stack)
            .saturating_sub(timed_count[index] * period);
        if untimed > 0 || timed_count[index] == 0 {
            group.stacks.push((code.clone(), untimed));
        }
        placed.push((group_index, code));
    }
    for sample in timeline {
        if let Some((group, code)) = placed.get(sample.stack) {
            let timed = &mut groups[*group].timed;
            match timed.last_mut() {
                // One sample for consecutive samples of one stack, as speedscope's own
                // importers write them.
                Some((last, weight)) if last == code => *weight += period,
                _ => timed.push((code.clone(), period)),
            }
        }
    }
    // Speedscope opens the first profile: make it the busiest.
    groups.sort_by_cached_key(|g| (std::cmp::Reverse(g.total()), g.name(&labels)));

    let mut frames: Vec<Frame> = Vec::new();
    let mut index_of: HashMap<FrameId, usize> = HashMap::new();
    let mut profiles = Vec::with_capacity(groups.len().max(1));
    for mut group in groups {
        let name = group.name(&labels);
        group.stacks.sort_by(|(a, _), (b, _)| {
            let names = |s: &[FrameId]| s.iter().map(|&id| labels[id].as_str()).collect::<Vec<_>>();
            names(a).cmp(&names(b)).then_with(|| a.cmp(b))
        });
        let mut samples: Vec<Vec<usize>> = Vec::new();
        let mut weights: Vec<u64> = Vec::new();
        for (stack, weight) in &group.timed {
            samples.push(
                stack
                    .iter()
                    .map(|&id| {
                        *index_of.entry(id).or_insert_with(|| {
                            frames.push(frame(&profile.frames[id], &labels[id]));
                            frames.len() - 1
                        })
                    })
                    .collect(),
            );
            weights.push(*weight);
        }
        let mut previous: Option<&[FrameId]> = None;
        for (stack, count) in group.stacks.iter().filter(|(_, n)| *n > 0) {
            // Stacks that differed only in pseudo-frames or addresses are the same stack here.
            if previous == Some(stack.as_slice()) && weights.len() > group.timed.len() {
                *weights.last_mut().expect("a previous sample") += count;
                continue;
            }
            previous = Some(stack);
            let sample = stack
                .iter()
                .map(|&id| {
                    *index_of.entry(id).or_insert_with(|| {
                        frames.push(frame(&profile.frames[id], &labels[id]));
                        frames.len() - 1
                    })
                })
                .collect();
            samples.push(sample);
            weights.push(*count);
        }
        profiles.push(SampledProfile {
            kind: "sampled",
            name,
            unit: UNIT,
            start_value: 0,
            end_value: weights.iter().sum(),
            samples,
            weights,
        });
    }
    if profiles.is_empty() {
        // speedscope shows nothing at all for a file without profiles: an empty one at least
        // names what was profiled.
        profiles.push(empty_profile(profile));
    }

    let file = File {
        schema: SCHEMA,
        name: super::svg::title(&profile.meta),
        exporter: format!("bpfprof {}", env!("CARGO_PKG_VERSION")),
        active_profile_index: 0,
        shared: Shared { frames },
        profiles,
    };
    serde_json::to_writer(&mut *w, &file)?;
    writeln!(w)
}

/// A speedscope frame for a code frame or the `[truncated]` marker.
fn frame(frame: &ProfileFrame, label: &str) -> Frame {
    let ProfileFrame::Code(code) = frame else {
        return Frame {
            name: label.to_string(),
            file: None,
            line: None,
        };
    };
    let (file, line) = match &code.file {
        Some(file) => (Some(file.to_string()), code.line),
        None => {
            let module = code.module.as_deref().map(str::to_string);
            let file = if code.kind == FrameKind::Kernel {
                // Kernel modules are named bare (`ext4`): keep them recognisably kernel.
                Some(match module {
                    Some(m) if m.starts_with('[') => m,
                    Some(m) => format!("[kernel] {m}"),
                    None => "[kernel]".to_string(),
                })
            } else {
                module
            };
            (file, None)
        }
    };
    Frame {
        name: label.to_string(),
        file,
        line,
    }
}

/// The one profile of a run without samples: named after its targets and tags.
fn empty_profile(profile: &Profile) -> SampledProfile {
    let mut comms: Vec<&str> = Vec::new();
    for target in &profile.meta.targets {
        if !comms.contains(&target.comm.as_str()) {
            comms.push(&target.comm);
        }
    }
    let mut name = if comms.is_empty() {
        "bpfprof".to_string()
    } else {
        comms.join(", ")
    };
    for tag in &profile.meta.tags {
        name.push(' ');
        name.push_str(&tag.label);
    }
    name.push_str(" (no samples)");
    SampledProfile {
        kind: "sampled",
        name,
        unit: UNIT,
        start_value: 0,
        end_value: 0,
        samples: Vec::new(),
        weights: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        process::Command,
    };

    use serde_json::Value;

    use super::*;
    use crate::{output::fixture, profile::StackCount};

    fn validators() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/validators/node_modules")
    }

    /// Skips a test off CI when a validator is missing; on CI a missing validator fails it.
    fn missing(what: &str) -> bool {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "{what} is required on CI"
        );
        eprintln!("skipped: {what} not found");
        true
    }

    /// The speedscope package's own schema, when the validators are installed.
    fn schema_path() -> Option<PathBuf> {
        let schema = validators().join("speedscope/dist/release/file-format-schema.json");
        let ajv = validators().join("ajv/package.json");
        let node = Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !node && missing("node") {
            return None;
        }
        if !(schema.is_file() && ajv.is_file())
            && missing(&format!(
                "speedscope and ajv under {} (run `cargo xtask setup`)",
                validators().display()
            ))
        {
            return None;
        }
        Some(schema)
    }

    /// A file in the temporary directory, removed when dropped.
    struct TempFile(PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Validates `json` against speedscope's schema with ajv: the validator's errors, if any.
    fn ajv_errors(schema: &Path, name: &str, json: &[u8]) -> Result<(), String> {
        const SCRIPT: &str = r#"
const fs = require('fs');
const Ajv = require('ajv');
const [schemaPath, dataPath] = process.argv.slice(1);
const ajv = new Ajv({ strict: false, allErrors: true });
const validate = ajv.compile(JSON.parse(fs.readFileSync(schemaPath, 'utf8')));
if (!validate(JSON.parse(fs.readFileSync(dataPath, 'utf8')))) {
    console.error(JSON.stringify(validate.errors, null, 2));
    process.exit(1);
}
"#;
        let file = TempFile(std::env::temp_dir().join(format!(
            "bpfprof-speedscope-test-{}-{name}.json",
            std::process::id()
        )));
        std::fs::write(&file.0, json).unwrap();
        let output = Command::new("node")
            .env("NODE_PATH", validators())
            .args(["-e", SCRIPT])
            .arg(schema)
            .arg(&file.0)
            .output()
            .unwrap();
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    fn render(profile: &Profile) -> (Vec<u8>, Value) {
        let mut out = Vec::new();
        write(profile, &mut out).unwrap();
        let value = serde_json::from_slice(&out).unwrap();
        (out, value)
    }

    /// Checks what the schema cannot: indices in range, one weight per sample, the totals.
    fn check_consistent(file: &Value) {
        let frames = file["shared"]["frames"].as_array().unwrap().len();
        for profile in file["profiles"].as_array().unwrap() {
            let samples = profile["samples"].as_array().unwrap();
            let weights = profile["weights"].as_array().unwrap();
            assert_eq!(samples.len(), weights.len());
            for sample in samples {
                for index in sample.as_array().unwrap() {
                    assert!((index.as_u64().unwrap() as usize) < frames);
                }
            }
            let total: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
            assert_eq!(profile["endValue"].as_u64(), Some(total));
            assert_eq!(profile["startValue"].as_u64(), Some(0));
        }
    }

    /// Nanoseconds one sample of the fixture stands for: its cpu-clock period.
    const SAMPLE_NS: u64 = 1_001_001;

    /// The frame names of each sample of profile `index`, leaf last, with its weight in
    /// samples (weights are nanoseconds, whole multiples of the period).
    fn named_samples(file: &Value, index: usize) -> Vec<(Vec<String>, u64)> {
        let frames = file["shared"]["frames"].as_array().unwrap();
        let profile = &file["profiles"][index];
        let samples = profile["samples"].as_array().unwrap();
        let weights = profile["weights"].as_array().unwrap();
        samples
            .iter()
            .zip(weights)
            .map(|(sample, weight)| {
                let names = sample
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| {
                        let frame = &frames[i.as_u64().unwrap() as usize];
                        frame["name"].as_str().unwrap().to_string()
                    })
                    .collect();
                let ns = weight.as_u64().unwrap();
                assert_eq!(ns % SAMPLE_NS, 0, "{ns} ns is not whole samples");
                (names, ns / SAMPLE_NS)
            })
            .collect()
    }

    #[test]
    fn fixture_matches_the_schema_and_the_profile() {
        let profile = fixture::profile();
        let (json, file) = render(&profile);
        assert_eq!(json, render(&profile).0, "output must be deterministic");

        assert_eq!(file["$schema"], SCHEMA);
        assert_eq!(file["name"], "bpfprof: app (pid 1234)");
        assert_eq!(
            file["exporter"],
            format!("bpfprof {}", env!("CARGO_PKG_VERSION"))
        );
        let profiles = file["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 1);
        assert_eq!(profiles[0]["name"], "app [phase=train]");
        assert_eq!(profiles[0]["type"], "sampled");
        // Time, as speedscope shows pprof's profiles: 100 samples of 1.001001 ms.
        assert_eq!(profiles[0]["unit"], "nanoseconds");
        assert_eq!(profiles[0]["endValue"], 100 * SAMPLE_NS);
        check_consistent(&file);

        let samples = named_samples(&file, 0);
        let self_weight = |leaf: &str| -> u64 {
            samples
                .iter()
                .filter(|(names, _)| names.last().is_some_and(|n| n.starts_with(leaf)))
                .map(|(_, w)| w)
                .sum()
        };
        assert_eq!(self_weight("leaf_hot"), 70);
        assert_eq!(self_weight("leaf_cold"), 20);
        assert_eq!(self_weight("sys_write"), 8);
        assert!(samples.contains(&(
            vec![
                "main (app.c:10)".to_string(),
                "parent_hot (app.c:20)".to_string(),
                "leaf_hot (app.c:30)".to_string()
            ],
            60
        )));
        assert!(samples.contains(&(vec!["[truncated]".to_string(), "deep".to_string()], 2)));
        // The pseudo-frames name the profile and are kept out of the stacks.
        for (names, _) in &samples {
            assert!(
                !names.iter().any(|n| n == "app" || n.contains("phase")),
                "{names:?}"
            );
        }

        let frames = file["shared"]["frames"].as_array().unwrap();
        let find = |prefix: &str| {
            frames
                .iter()
                .find(|f| f["name"].as_str().unwrap().starts_with(prefix))
                .unwrap()
        };
        assert_eq!(find("leaf_hot")["file"], "/src/app.c");
        assert_eq!(find("leaf_hot")["line"], 30);
        assert_eq!(find("sys_write")["name"], "sys_write");
        assert_eq!(find("sys_write")["file"], "[kernel]");
        assert!(find("[truncated]").get("file").is_none());

        let Some(schema) = schema_path() else {
            return;
        };
        if let Err(errors) = ajv_errors(&schema, "fixture", &json) {
            panic!("speedscope's schema rejects the output: {errors}");
        }
        // The validator must be able to fail, or the check above proves nothing.
        let mut broken = file.clone();
        broken["profiles"][0]
            .as_object_mut()
            .unwrap()
            .remove("weights");
        let broken = serde_json::to_vec(&broken).unwrap();
        assert!(ajv_errors(&schema, "broken", &broken).is_err());
    }

    #[test]
    fn per_thread_profiles_get_one_profile_each() {
        let mut profile = fixture::profile();
        profile.frames.push(ProfileFrame::Thread {
            name: "app (tid 1234)".into(),
            tid: 1234,
            comm: "app".into(),
        });
        profile.frames.push(ProfileFrame::Thread {
            name: "worker (tid 1240)".into(),
            tid: 1240,
            comm: "worker".into(),
        });
        let (main, worker) = (profile.frames.len() - 2, profile.frames.len() - 1);
        for (i, stack) in profile.stacks.iter_mut().enumerate() {
            let thread = if i == 0 { main } else { worker };
            stack.frames.insert(2, thread);
        }
        // Also a second process, without tags, that a thread of the first must not swallow.
        profile.frames.push(ProfileFrame::Process {
            name: "db".into(),
            pid: 99,
            comm: "db".into(),
        });
        let db = profile.frames.len() - 1;
        profile.stacks.push(StackCount {
            frames: vec![db, 2],
            count: 5,
            off_cpu_ns: 0,
            addresses: Vec::new(),
        });

        let (json, file) = render(&profile);
        check_consistent(&file);
        let names: Vec<&str> = file["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "app: app (tid 1234) [phase=train]",
                "app: worker (tid 1240) [phase=train]",
                "db"
            ]
        );
        let totals: Vec<u64> = file["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["endValue"].as_u64().unwrap())
            .collect();
        assert_eq!(totals, [60 * SAMPLE_NS, 40 * SAMPLE_NS, 5 * SAMPLE_NS]);
        assert_eq!(
            named_samples(&file, 2),
            [(vec!["main (app.c:10)".to_string()], 5)]
        );

        if let Some(schema) = schema_path() {
            if let Err(errors) = ajv_errors(&schema, "per-thread", &json) {
                panic!("speedscope's schema rejects the output: {errors}");
            }
        }
    }

    #[test]
    fn weights_are_time_for_every_event() {
        // Cycles at 250 Hz: each sample stands for 4 ms, whatever the clock speed.
        let mut profile = fixture::profile();
        profile.meta.sampling = crate::sampling::Sampling {
            event: crate::sampling::Event::Cycles,
            rate: crate::sampling::Rate::Period(10_000_000),
            nominal_hz: 250.0,
            fallback: false,
            jitter: true,
        };
        let (_, file) = render(&profile);
        assert_eq!(file["profiles"][0]["unit"], "nanoseconds");
        assert_eq!(file["profiles"][0]["endValue"], 100 * 4_000_000);
    }

    #[test]
    fn empty_profile_still_opens() {
        let mut profile = fixture::profile();
        profile.stacks.clear();
        let (json, file) = render(&profile);
        check_consistent(&file);
        let profiles = file["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 1);
        assert_eq!(profiles[0]["name"], "app [phase=train] (no samples)");
        assert_eq!(profiles[0]["endValue"], 0);
        assert_eq!(profiles[0]["unit"], "nanoseconds");
        if let Some(schema) = schema_path() {
            if let Err(errors) = ajv_errors(&schema, "empty", &json) {
                panic!("speedscope's schema rejects the output: {errors}");
            }
        }
    }
}

#[cfg(test)]
mod time_order_tests {
    use serde_json::Value;

    use super::write;
    use crate::{
        output::fixture,
        profile::{TimedSample, Timeline},
    };

    #[test]
    fn with_a_timeline_samples_come_in_time_order_and_totals_stay() {
        let mut profile = fixture::profile();
        let untimed_total: u64 = profile.stacks.iter().map(|s| profile.stack_nanos(s)).sum();
        // Stack 1 (leaf_cold) first, then stack 0 (leaf_hot), then 1 again: the reverse of
        // the name order the profile without a timeline is written in.
        let order = [1, 1, 0, 0, 0, 1];
        profile.timeline = Some(Timeline {
            samples: order
                .iter()
                .enumerate()
                .map(|(i, &stack)| TimedSample {
                    time_ns: 1_000 + i as u64,
                    pid: 1234,
                    tid: 1234,
                    stack,
                })
                .collect(),
            ..Timeline::default()
        });
        let mut out = Vec::new();
        write(&profile, &mut out).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        let names: Vec<&str> = doc["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        let p = &doc["profiles"][0];
        let leaves: Vec<&str> = p["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| names[s.as_array().unwrap().last().unwrap().as_u64().unwrap() as usize])
            .collect();
        let period = profile.meta.sample_nanos();
        let weights: Vec<u64> = p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_u64().unwrap())
            .collect();
        assert!(leaves[0].starts_with("leaf_cold"), "{leaves:?}");
        assert!(leaves[1].starts_with("leaf_hot"), "{leaves:?}");
        assert!(leaves[2].starts_with("leaf_cold"), "{leaves:?}");
        assert_eq!(&weights[..3], &[2 * period, 3 * period, period]);
        assert_eq!(weights.iter().sum::<u64>(), untimed_total);
    }
}
