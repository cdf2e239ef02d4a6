//! End to end: the timeline. The real kernel program records each sample's time for a run that
//! writes a `.trace.json`; the `phases` workload's thread runs `a` (under `phase_a`) for a
//! second of its CPU time, then `b` (under `phase_b`) for another. The trace is checked
//! against the Chrome trace event format's documented fields (Perfetto's trace processor from
//! PyPI downloads its engine on first use, which this machine cannot), its slices for that
//! thread in order and nesting, and speedscope's "Time Order" for the same order. Needs root.

use std::{collections::BTreeMap, path::Path, time::Duration};

use bpfprof_tests::*;
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(120);
/// Fewest samples of each phase for the shares to mean something; a loaded machine that gives
/// fewer gets a longer run.
const MIN_PHASE_SAMPLES: f64 = 150.0;

/// One complete event (`ph: X`) of the trace, in microseconds.
#[derive(Clone, Debug)]
struct Slice {
    name: String,
    ts: i64,
    dur: i64,
    depth: usize,
    parent: Option<String>,
}

/// Checks every event against the trace event format's documented fields, and returns the
/// thread names (by pid and tid), the slices of each thread with their nesting, and the
/// instant events' names.
#[allow(clippy::type_complexity)]
fn check_trace(
    doc: &Value,
) -> (
    BTreeMap<(u64, u64), String>,
    BTreeMap<(u64, u64), Vec<Slice>>,
    Vec<String>,
) {
    let events = doc["traceEvents"]
        .as_array()
        .expect("a JSON object trace has a traceEvents array");
    let mut names = BTreeMap::new();
    let mut raw: BTreeMap<(u64, u64), Vec<(String, i64, i64)>> = BTreeMap::new();
    let mut instants = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        let name = e["name"].as_str().unwrap_or_else(|| panic!("no name: {e}"));
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {e}"));
        let tid = e["tid"].as_u64().unwrap_or_else(|| panic!("no tid: {e}"));
        let ts = e["ts"].as_i64().unwrap_or_else(|| panic!("no ts: {e}"));
        match ph {
            "M" => {
                assert!(
                    ["process_name", "thread_name"].contains(&name),
                    "metadata {name}"
                );
                let value = e["args"]["name"].as_str().expect("a metadata name");
                if name == "thread_name" {
                    names.insert((pid, tid), value.to_string());
                }
            }
            "X" => {
                let dur = e["dur"].as_i64().unwrap_or_else(|| panic!("no dur: {e}"));
                assert!(dur >= 0, "{e}");
                raw.entry((pid, tid))
                    .or_default()
                    .push((name.to_string(), ts, dur));
            }
            "i" => {
                assert!(
                    ["g", "p", "t"].contains(&e["s"].as_str().unwrap_or("t")),
                    "{e}"
                );
                instants.push(name.to_string());
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    // Complete events on one thread must nest (as the viewers' importers require): each one
    // ends within the one it starts in.
    let mut slices = BTreeMap::new();
    for (thread, events) in raw {
        let mut open: Vec<(String, i64)> = Vec::new();
        let mut out = Vec::new();
        for (name, ts, dur) in events {
            while open.last().is_some_and(|(_, end)| *end <= ts) {
                open.pop();
            }
            if let Some((parent, end)) = open.last() {
                assert!(
                    ts + dur <= *end,
                    "{name} [{ts}, +{dur}] overlaps the end of {parent} ({end}) on {thread:?}"
                );
            }
            out.push(Slice {
                name: name.clone(),
                ts,
                dur,
                depth: open.len(),
                parent: open.last().map(|(p, _)| p.clone()),
            });
            open.push((name, ts + dur));
        }
        slices.insert(thread, out);
    }
    (names, slices, instants)
}

/// Samples (speedscope weights, in period units) whose stack holds `a`, and holds `b`; and
/// whether every `a` sample comes before every `b` sample in the profile's sample order.
fn speedscope_order(doc: &Value) -> (f64, f64, bool) {
    let frames: Vec<&str> = doc["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    let profile = doc["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|p| p["samples"].as_array().map_or(0, Vec::len))
        .expect("a profile");
    let (mut a, mut b) = (0.0, 0.0);
    let (mut last_a, mut first_b) = (None, None);
    let samples = profile["samples"].as_array().unwrap();
    for (i, (stack, weight)) in samples
        .iter()
        .zip(profile["weights"].as_array().unwrap())
        .enumerate()
    {
        let names: Vec<&str> = stack
            .as_array()
            .unwrap()
            .iter()
            .map(|f| frames[f.as_u64().unwrap() as usize])
            .collect();
        let w = weight.as_f64().unwrap();
        if names.contains(&"a") {
            a += w;
            last_a = Some(i);
        }
        if names.contains(&"b") {
            b += w;
            first_b = first_b.or(Some(i));
        }
    }
    let ordered = matches!((last_a, first_b), (Some(x), Some(y)) if x < y);
    (a, b, ordered)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("reading the output"))
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

#[test]
fn the_trace_shows_phase_a_then_phase_b_as_nested_slices() {
    needs_root!();
    let dir = tempdir();
    let trace_path = dir.path().join("phases.trace.json");
    let speedscope_path = dir.path().join("phases.speedscope.json");
    let phases = workload_path("phases");
    // Each phase is CPU time of the workload's thread: a loaded machine stretches the run, not
    // the samples; a longer run is asked for when it still gave too few.
    for secs in ["1", "2", "4"] {
        let args = [
            "-F",
            "499",
            "-q",
            "--tag",
            "phase=e2e",
            "-o",
            trace_path.to_str().unwrap(),
            "-o",
            speedscope_path.to_str().unwrap(),
            "--",
            phases.to_str().unwrap(),
            secs,
        ];
        run_bpfprof(args, TIMEOUT).assert_code(0);
        let speedscope = read_json(&speedscope_path);
        let (a_samples, b_samples, ordered) = speedscope_order(&speedscope);
        let period = 1e9 / 499.0;
        let (a_n, b_n) = (a_samples / period, b_samples / period);
        if (a_n < MIN_PHASE_SAMPLES || b_n < MIN_PHASE_SAMPLES) && secs != "4" {
            eprintln!("{a_n:.0} and {b_n:.0} samples of the phases: a longer run");
            continue;
        }
        // Speedscope's "Time Order": every sample of a before every sample of b.
        assert!(ordered, "speedscope's samples are not in time order");

        let trace = read_json(&trace_path);
        let (names, slices, instants) = check_trace(&trace);
        let (&thread, _) = names
            .iter()
            .find(|(_, name)| name.starts_with("phaser (tid "))
            .unwrap_or_else(|| panic!("no phaser thread track among {names:?}"));
        let slices = &slices[&thread];
        let named =
            |name: &str| -> Vec<&Slice> { slices.iter().filter(|s| s.name == name).collect() };
        let (a, b) = (named("a"), named("b"));
        assert!(
            !a.is_empty() && !b.is_empty(),
            "{:?}",
            &slices[..slices.len().min(40)]
        );
        // Each phase's function sits under its phase's function, and the slices of a end
        // before those of b begin.
        assert!(
            a.iter().all(|s| s.parent.as_deref() == Some("phase_a")),
            "{a:?}"
        );
        assert!(
            b.iter().all(|s| s.parent.as_deref() == Some("phase_b")),
            "{b:?}"
        );
        let a_end = a.iter().map(|s| s.ts + s.dur).max().unwrap();
        let b_start = b.iter().map(|s| s.ts).min().unwrap();
        assert!(
            a_end <= b_start,
            "a ends at {a_end} us, after b starts at {b_start} us"
        );
        // Consecutive samples merged: a phase of hundreds of samples is a few long slices.
        let phase_a = named("phase_a");
        assert!(
            phase_a.len() * 10 <= a_n as usize,
            "{} phase_a slices for {a_n:.0} samples",
            phase_a.len()
        );
        assert!(
            phase_a.iter().all(|s| s.depth >= 1),
            "phase_a is below the thread's root"
        );
        // The slices' time split as the samples split (the trace's durations come from the
        // same samples, each standing until the next).
        let total = |v: &[&Slice]| v.iter().map(|s| s.dur as f64).sum::<f64>();
        let trace_share = total(&a) / (total(&a) + total(&b));
        let sample_share = a_n / (a_n + b_n);
        assert!(
            (trace_share - sample_share).abs() <= 0.1,
            "a holds {trace_share:.3} of the trace's a+b time but {sample_share:.3} of the samples"
        );
        assert!(
            (0.3..=0.7).contains(&sample_share),
            "the phases burn equal CPU time, yet a has {sample_share:.3} of their samples"
        );
        // The run's tags mark its start and end.
        assert!(
            instants.iter().any(|n| n == "[phase=e2e] started")
                && instants.iter().any(|n| n == "[phase=e2e] ended"),
            "{instants:?}"
        );
        return;
    }
}

#[test]
fn a_daemon_run_asking_for_a_trace_gets_one_marked_by_its_tags() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    // Twice: the kernel program's timeline ring is mapped while a run records a timeline and
    // unmapped after, so the second run's trace needs it mapped again.
    for _ in 0..2 {
        daemon_trace_run(&daemon);
    }
}

/// One daemon run of the `phases` workload asking for a trace, checked.
fn daemon_trace_run(daemon: &Daemon) {
    // Two seconds of the thread's CPU in each phase: the daemon attaches while phase_a runs.
    let target = Workload::spawn("phases", &["2"]);
    let pid = format!("{}:{}", pid_ns_inode(target.pid()), target.pid());
    let run = daemon.cli(&bpfprof_tests::async_run_args(
        &pid,
        "60000",
        &["--tag", "phase=train", "--formats", "trace,folded"],
    ));
    let id = bpfprof_tests::hostile::run_id_of(&run).to_string();
    // The run ends when the workload does.
    let results = daemon.cli(&["results", "--run-id", &id, "--wait", "100s", "--json"]);
    results.assert_code(0);
    let reply: Value = serde_json::from_str(&results.stdout).unwrap();
    let path = reply["files"]["trace"]
        .as_str()
        .unwrap_or_else(|| panic!("no trace: {reply:#}"));
    assert!(path.ends_with(".trace.json"), "{path}");
    let (names, slices, instants) = check_trace(&read_json(Path::new(path)));
    assert!(
        instants.iter().any(|n| n == "[phase=train] started")
            && instants.iter().any(|n| n == "[phase=train] ended"),
        "{instants:?}"
    );
    let (thread, _) = names
        .iter()
        .find(|(_, name)| name.starts_with("phaser (tid "))
        .unwrap_or_else(|| panic!("no phaser thread track among {names:?}"));
    let slices = &slices[thread];
    let a_end = slices
        .iter()
        .filter(|s| s.name == "a")
        .map(|s| s.ts + s.dur)
        .max();
    let b_start = slices.iter().filter(|s| s.name == "b").map(|s| s.ts).min();
    match (a_end, b_start) {
        (Some(a_end), Some(b_start)) => assert!(a_end <= b_start, "{a_end} > {b_start}"),
        other => panic!("a and b slices: {other:?}"),
    }
}
