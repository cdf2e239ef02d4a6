//! The pprof writer's tests: the profile decoded back, and read by `go tool pprof` and the
//! npm `pprof-format` reader where they are installed.

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
fn a_process_s_own_labels_are_string_labels_of_its_samples() {
    let mut profile = fixture::profile();
    profile.meta.tags.clear();
    profile.process_labels.insert(
        1234,
        vec![
            ("service_name".into(), "checkout".into()),
            ("host".into(), "web-1".into()),
        ],
    );
    // Another pid's labels go to its samples only.
    profile
        .process_labels
        .insert(77, vec![("service_name".into(), "other".into())]);
    let p = decode(&encode(&profile));
    for sample in &p.sample {
        let labels: Vec<(&str, &str, i64)> = sample
            .label
            .iter()
            .map(|l| (s(&p, l.key), s(&p, l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("service_name", "checkout", 0),
                ("host", "web-1", 0),
                ("pid", "", 1234),
                ("comm", "app", 0)
            ]
        );
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
    let at = |address: u64, mapping: usize| {
        Some(CodeAddress {
            address,
            mapping: mapping as u32,
        })
    };
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
            l.line
                .iter()
                .any(|line| s(&p, p.function[line.function_id as usize - 1].name) == "leaf_cold")
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
