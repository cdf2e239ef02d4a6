//! End to end: a daemon run ends on its deadline at any rate. At `-F 100000` every CPU's
//! samples (bpfprof's own threads' included) slowed the daemon's ticks to seconds, and the run
//! sampled until the tick in progress ended; a thread of the run's own now stops its sampling
//! at the deadline (its run alone: the daemon's programs are shared between runs, so their
//! events are not switched off). Judged by the span of the run's own samples in its trace,
//! as the command line's `lifecycle::the_duration_is_kept_at_the_highest_rate` is. Needs root.

use std::{path::Path, time::Duration};

use bpfprof::protocol::{RunRequest, RunState};
use bpfprof_tests::*;

/// The run's duration.
const DURATION_MS: u64 = 1000;
/// How far past the deadline the samples may reach: the bound (0.5 s).
const DEADLINE_SLACK: f64 = 0.5;

#[test]
fn a_daemon_run_at_the_highest_rate_ends_on_its_deadline() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let mut busy = std::process::Command::new("/usr/bin/python3");
    busy.args([
        "-c",
        "def spin():\n    while True:\n        sum(i * i for i in range(1000))\nspin()",
    ]);
    let target = Workload::spawn_command(busy);
    std::thread::sleep(Duration::from_millis(500));
    let mut client = daemon.client();
    client.set_io_timeout(Duration::from_secs(120));
    let reply = client
        .run(RunRequest {
            pid: target.pid(),
            frequency: Some(100_000),
            duration_ms: Some(DURATION_MS),
            formats: Some(vec!["trace-json".into()]),
            ..RunRequest::default()
        })
        .expect("the run starts");
    let id = reply.run_id.expect("a run id");
    let reply = client
        .results(id, Duration::from_secs(120))
        .expect("the run's results");
    assert_eq!(reply.state, Some(RunState::Success), "{reply:?}");
    let files = reply.files.expect("result files");
    let trace = files
        .get("trace")
        .or_else(|| files.get("trace-json"))
        .unwrap_or_else(|| panic!("no trace among {files:?}"));
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(trace)).expect("the trace")).expect("JSON");
    let (mut first, mut last) = (f64::MAX, f64::MIN);
    for event in trace["traceEvents"].as_array().expect("traceEvents") {
        if event["ph"] == "X" {
            let ts = event["ts"].as_f64().unwrap_or_default();
            first = first.min(ts);
            last = last.max(ts + event["dur"].as_f64().unwrap_or_default());
        }
    }
    let span = (last - first) / 1e6;
    let bound = DURATION_MS as f64 / 1000.0 + DEADLINE_SLACK;
    eprintln!("daemon run at 100 kHz for 1 s: its samples span {span:.3} s (bound {bound:.1} s)");
    assert!(
        span > 0.3 && span <= bound,
        "the samples of a 1 s daemon run span {span:.3} s (bound {bound:.1} s)"
    );
}
