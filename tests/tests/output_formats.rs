//! End to end: one real profile of the `hotcold` workload written in every format at once, each
//! file opened by an independent reader (xmllint, Google's pprof format through the
//! `pprof-format` npm decoder, speedscope's own JSON schema through ajv, Python's `pstats`), and
//! checked against the known truth (leaf_hot:leaf_cold = 75:25). Needs root.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);
/// Tolerance on the 75% share: see hotcold.rs for why 6 points is generous yet meaningful.
const TOLERANCE: f64 = 0.06;

/// The npm validators `cargo xtask setup` installs.
fn validators() -> Option<PathBuf> {
    let dir = workspace_root().join("target/validators/node_modules");
    let ready = ["pprof-format", "speedscope", "ajv"]
        .iter()
        .all(|m| dir.join(m).join("package.json").is_file())
        && find_tool("node").is_some();
    if ready {
        return Some(dir);
    }
    assert!(
        !ci(),
        "node and the npm validators are needed under CI: run `cargo xtask setup`"
    );
    eprintln!("skipping: node or the validators are missing (run `cargo xtask setup`)");
    None
}

/// Runs a node script with the validators on NODE_PATH; returns its stdout parsed as JSON.
fn node(modules: &Path, script: &str, file: &Path) -> serde_json::Value {
    let out = Command::new("node")
        .arg("-e")
        .arg(script)
        .arg(file)
        .env("NODE_PATH", modules)
        .output()
        .expect("running node");
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("node printed JSON")
}

fn python(script: &str, file: &Path) -> serde_json::Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(file)
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("python printed JSON")
}

fn assert_share(what: &str, hot: f64, cold: f64) {
    let share = hot / (hot + cold);
    assert!(
        (share - 0.75).abs() <= TOLERANCE,
        "{what}: leaf_hot share {share:.3} ({hot} vs {cold}), expected 0.75 +- {TOLERANCE}"
    );
}

const PPROF_SCRIPT: &str = r#"
const fs = require("fs"), zlib = require("zlib");
const { Profile } = require("pprof-format");
const p = Profile.decode(zlib.gunzipSync(fs.readFileSync(process.argv[1])));
const str = (i) => p.stringTable.strings[Number(i)];
const fnName = new Map(p.function.map((f) => [String(f.id), str(f.name)]));
const loc = new Map(p.location.map((l) => [String(l.id), l]));
let hot = 0, cold = 0, labelled = 0, tagged = 0;
for (const s of p.sample) {
  const leaf = loc.get(String(s.locationId[0]));
  const names = leaf.line.map((l) => fnName.get(String(l.functionId)));
  const n = Number(s.value[0]);
  if (names.includes("leaf_hot")) hot += n;
  if (names.includes("leaf_cold")) cold += n;
  const labels = s.label.map((l) => str(l.key) + "=" + str(l.str));
  if (labels.includes("phase=e2e")) labelled++;
  if (labels.includes("tag=t1")) tagged++;
}
console.log(JSON.stringify({
  samples: p.sample.length, hot, cold, labelled, tagged,
  types: p.sampleType.map((t) => str(t.type) + "/" + str(t.unit)),
  comments: p.comment.map(str),
  mappings: p.mapping.map((m) => [str(m.filename), str(m.buildId)]),
}));
"#;

const SPEEDSCOPE_SCRIPT: &str = r#"
const fs = require("fs");
const Ajv = require("ajv");
const schema = JSON.parse(fs.readFileSync(require.resolve("speedscope/dist/release/file-format-schema.json")));
const doc = JSON.parse(fs.readFileSync(process.argv[1]));
const ajv = new Ajv({ strict: false });
const valid = ajv.validate(schema, doc);
const frames = doc.shared.frames.map((f) => f.name);
let hot = 0, cold = 0;
for (const prof of doc.profiles) {
  prof.samples.forEach((stack, i) => {
    const leaf = frames[stack[stack.length - 1]];
    if (leaf === "leaf_hot") hot += prof.weights[i];
    if (leaf === "leaf_cold") cold += prof.weights[i];
  });
}
console.log(JSON.stringify({ valid, errors: ajv.errors, hot, cold, names: doc.profiles.map((p) => p.name) }));
"#;

const PSTATS_SCRIPT: &str = r#"
import io, json, pstats, sys
s = pstats.Stats(sys.argv[1])
s.stream = io.StringIO()
s.sort_stats("cumulative").print_stats(10)
by_name = {}
for (file, line, name), (cc, nc, tt, ct, callers) in s.stats.items():
    by_name[name] = {"tt": tt, "ct": ct, "callers": sorted(k[2] for k in callers)}
print(json.dumps({"functions": by_name, "total_tt": s.total_tt}))
"#;

#[test]
fn every_format_opens_in_its_reader_with_tags_and_the_true_split() {
    if !require_root() {
        return;
    }
    let modules = validators();
    let target = Workload::spawn("hotcold", &["60"]);
    std::thread::sleep(Duration::from_millis(200));
    let dir = tempdir();
    let path = |name: &str| dir.path().join(name);
    let pid = target.pid().to_string();
    let mut args: Vec<String> = [
        "--pid",
        &pid,
        "-F",
        "999",
        "-d",
        "3s",
        "--tag",
        "phase=e2e",
        "--sample-tags",
        "t1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for name in [
        "p.svg",
        "p.folded",
        "p.pb.gz",
        "p.speedscope.json",
        "p.prof",
        "p.txt",
        "p.summary.json",
    ] {
        args.push("-o".into());
        args.push(path(name).display().to_string());
    }
    let run = run_bpfprof(&args, TIMEOUT);
    run.assert_code(0);

    let folded = Profile::read(&path("p.folded"));
    let total = folded.total();
    assert!(
        total > 1000,
        "{total} samples in 3 s at 999 Hz\n{}",
        folded.top(5)
    );
    assert_share(
        "folded",
        folded.count_containing("leaf_hot") as f64,
        folded.count_containing("leaf_cold") as f64,
    );
    // Tags are root pseudo-frames on every stack.
    assert_eq!(
        folded.count_where(|f| f.first().map(String::as_str) == Some("[tag t1]")
            && f.get(1).map(String::as_str) == Some("[phase=e2e]")),
        total,
        "{}",
        folded.top(3)
    );

    // SVG: well-formed XML (xmllint), searchable frames, tags and the title.
    if find_tool("xmllint").is_some() {
        let lint = Command::new("xmllint")
            .arg("--noout")
            .arg(path("p.svg"))
            .output()
            .unwrap();
        assert!(
            lint.status.success(),
            "{}",
            String::from_utf8_lossy(&lint.stderr)
        );
    } else {
        assert!(!ci(), "xmllint is needed under CI");
    }
    let svg = std::fs::read_to_string(path("p.svg")).unwrap();
    for needle in [
        "leaf_hot",
        "parent_hot",
        "[phase=e2e]",
        "[tag t1]",
        "hotcold",
        "cpu-clock",
    ] {
        assert!(svg.contains(needle), "the flame graph lacks {needle:?}");
    }

    // pstats: Python's own reader.
    let stats = python(PSTATS_SCRIPT, &path("p.prof"));
    let f = &stats["functions"];
    assert_share(
        "pstats tottime",
        f["leaf_hot"]["tt"].as_f64().unwrap(),
        f["leaf_cold"]["tt"].as_f64().unwrap(),
    );
    assert_eq!(f["leaf_hot"]["callers"], serde_json::json!(["parent_hot"]));
    assert!(
        f.get("[phase=e2e]").is_some(),
        "tags are pstats root entries: {f}"
    );

    // Top table: leaf_hot first.
    let top = std::fs::read_to_string(path("p.txt")).unwrap();
    let first = top.lines().nth(2).unwrap_or_default();
    assert!(first.contains("leaf_hot"), "{top}");

    // Summary JSON agrees with the folded total and carries the tags.
    let summary = Summary::read(&path("p.summary.json"));
    assert_eq!(summary.samples(), total);
    let tags: Vec<String> = summary
        .field("tags")
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{}={}",
                t["key"].as_str().unwrap(),
                t["value"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(tags, ["tag=t1", "phase=e2e"]);

    let Some(modules) = modules else {
        return;
    };
    // pprof, decoded by a decoder we did not write.
    let pprof = node(&modules, PPROF_SCRIPT, &path("p.pb.gz"));
    let samples = pprof["samples"].as_u64().unwrap();
    assert!(samples > 0);
    assert_eq!(pprof["labelled"].as_u64(), Some(samples), "{pprof}");
    assert_eq!(pprof["tagged"].as_u64(), Some(samples), "{pprof}");
    assert_share(
        "pprof",
        pprof["hot"].as_f64().unwrap(),
        pprof["cold"].as_f64().unwrap(),
    );
    assert_eq!(
        pprof["types"],
        serde_json::json!(["samples/count", "cpu/nanoseconds"])
    );
    assert!(
        pprof["comments"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("cpu-clock")),
        "{pprof}"
    );
    let hotcold = pprof["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m[0] == "hotcold")
        .unwrap_or_else(|| panic!("no hotcold mapping: {pprof}"));
    assert_eq!(
        hotcold[1].as_str().unwrap().len(),
        40,
        "a 20-byte GNU build id: {pprof}"
    );

    // speedscope, validated against its own published schema.
    let speedscope = node(&modules, SPEEDSCOPE_SCRIPT, &path("p.speedscope.json"));
    assert_eq!(speedscope["valid"], true, "{speedscope}");
    assert_share(
        "speedscope",
        speedscope["hot"].as_f64().unwrap(),
        speedscope["cold"].as_f64().unwrap(),
    );
    assert!(
        speedscope["names"][0]
            .as_str()
            .unwrap()
            .contains("phase=e2e"),
        "{speedscope}"
    );
}

#[test]
fn format_top_without_output_prints_the_table() {
    if !require_root() {
        return;
    }
    let target = Workload::spawn("hotcold", &["60"]);
    std::thread::sleep(Duration::from_millis(200));
    let run = run_bpfprof(
        [
            "--pid",
            &target.pid().to_string(),
            "-F",
            "499",
            "-d",
            "1s",
            "--format",
            "top",
            "-q",
        ],
        TIMEOUT,
    );
    run.assert_code(0);
    assert!(
        run.stdout.starts_with("top functions by self samples:"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .lines()
            .nth(2)
            .unwrap_or_default()
            .contains("leaf_hot"),
        "{}",
        run.stdout
    );
}
