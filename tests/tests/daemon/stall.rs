//! End to end: one run's start-up never stalls the daemon. A run started, with sampling
//! settings of its own (so its kernel program loads and its walker verifies), on a process
//! that maps a ~430 MB library with real CFI (half a second to seconds of unwind-table
//! building once it is sampled) must not hold up other clients' requests nor the runs already
//! sampling, and a run on that process stops and delivers its results promptly (issues 21
//! and 22). Needs root.

use std::{
    io::Write,
    thread,
    time::{Duration, Instant},
};

use bpfprof::protocol::{RunRequest, RunState};
use bpfprof_tests::{
    hostile::{favor, spawn_favored_python, wait_for_mapping},
    large_library::large_library,
    *,
};

/// Bound on a client's round trip while a run starts: about lock waits, not scheduling.
const ANSWER_BOUND: Duration = Duration::from_millis(50);

/// CLOCK_MONOTONIC in seconds: the clock Python's `time.monotonic()` reads, so that the
/// unprivileged client's timings line up with this process's.
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The unprivileged client: one connection, `list` and `status` in turn as fast as answers
/// come, each answer's send time and round trip printed, until its stdin closes. Its `status`
/// asks for root's run A, which it may not see: the "no run" answer goes through the same
/// table as any other.
const CLIENT: &str = r#"
import json, select, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(20)
f = s.makefile("rwb", buffering=0)
run_id = int(sys.argv[2])
ops = [{"version": 1, "op": "list"}, {"version": 1, "op": "status", "run_id": run_id}]
i = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    op = ops[i % 2]
    i += 1
    sent = time.monotonic()
    f.write((json.dumps(op) + "\n").encode())
    try:
        line = f.readline()
    except OSError:
        print("%.6f %.6f %s timeout" % (sent, time.monotonic() - sent, op["op"]), flush=True)
        break
    took = time.monotonic() - sent
    if not line:
        print("closed", flush=True)
        break
    reply = json.loads(line)
    ok = reply.get("ok") or (reply.get("error") or {}).get("code") == "not_found"
    print("%.6f %.6f %s %s" % (sent, took, op["op"], "ok" if ok else line.decode().strip()), flush=True)
    time.sleep(0.005)
"#;

/// One answer the unprivileged client got.
#[derive(Debug, Clone)]
struct Answer {
    sent: f64,
    took: f64,
    op: String,
}

#[test]
fn a_run_starting_on_a_huge_library_stalls_neither_clients_nor_other_runs() {
    needs_root!();
    let library = large_library();
    let alice = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    favor(daemon.pid());

    // Run A samples a busy process.
    let busy = Workload::spawn("spinner", &["300"]);
    let mut root = daemon.client();
    root.set_io_timeout(Duration::from_secs(20));
    // B samples at another rate than A: it gets a kernel program of its own, whose walker
    // verifies while A samples.
    let request = |pid, frequency| RunRequest {
        pid,
        frequency: Some(frequency),
        duration_ms: Some(300_000),
        ..RunRequest::default()
    };
    let a = root
        .run(request(busy.pid(), 499))
        .expect("run A")
        .run_id
        .unwrap();
    poll_until(DAEMON_TIMEOUT, || {
        (root.status(a).unwrap().samples.unwrap_or(0) > 0).then_some(())
    })
    .expect("run A takes samples");

    // B's target maps the large library (and spins in it a second later).
    let big = Workload::spawn("nofp_dlopen", &[library.to_str().unwrap(), "300"]);
    wait_for_mapping(big.pid(), &library.file_name().unwrap().to_string_lossy());

    // Alice's client asks all along; run A's samples are read as root meanwhile. Favoured as
    // the daemon is: see [`favor`].
    let (socket, run_a) = (daemon.socket(), a.to_string());
    let (mut client, reader) =
        spawn_favored_python(&alice, CLIENT, &[socket.as_os_str(), run_a.as_ref()]);
    thread::sleep(Duration::from_millis(300));

    let big_pid = big.pid();
    let b_started = monotonic();
    let starter = thread::spawn(move || {
        let mut c = bpfprof::client::Client::connect(Some(&socket)).unwrap();
        c.set_io_timeout(Duration::from_secs(300));
        let reply = c.run(request(big_pid, 397));
        (reply, monotonic())
    });
    // A's samples, read as root while B starts, and for a while after (a table build may
    // also go on in the background once B samples).
    let mut a_samples: Vec<(f64, u64)> = Vec::new();
    let mut b_ended = None;
    while b_ended.is_none() || monotonic() < b_ended.unwrap() + 3.0 || monotonic() < b_started + 4.0
    {
        // A stalled daemon (the defect) answers after the stall, or never: the reading waits
        // for it a while, so that the test reports the numbers rather than a timeout.
        match root.status(a) {
            Ok(reply) => a_samples.push((monotonic(), reply.samples.unwrap_or(0))),
            Err(e) => {
                eprintln!("status of run A: {e}");
                a_samples.push((monotonic(), a_samples.last().map_or(0, |r| r.1)));
                break;
            }
        }
        if b_ended.is_none() && starter.is_finished() {
            b_ended = Some(monotonic());
        }
        thread::sleep(Duration::from_millis(100));
    }
    let (b_reply, b_answered) = starter.join().unwrap();
    let b = b_reply.expect("run B starts").run_id.unwrap();
    drop(client.stdin.take());
    let status = client.wait().unwrap();
    let lines = reader.join().unwrap();
    assert!(status.success(), "alice's client failed: {lines:?}");
    let answers: Vec<Answer> = lines
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, ' ').collect();
            assert!(
                f.len() == 4 && (f[3] == "ok" || f[3] == "timeout"),
                "alice's client got {l}"
            );
            Answer {
                sent: f[0].parse().unwrap(),
                took: f[1].parse().unwrap(),
                op: f[2].to_string(),
            }
        })
        .collect();
    let b_start = b_answered - b_started;
    let window: Vec<&Answer> = answers
        .iter()
        .filter(|x| x.sent + x.took >= b_started && x.sent <= b_answered)
        .collect();
    let slowest = answers
        .iter()
        .filter(|x| x.sent + x.took >= b_started)
        .max_by(|x, y| x.took.total_cmp(&y.took))
        .expect("alice got answers");
    let during: Vec<&(f64, u64)> = a_samples
        .iter()
        .filter(|(t, _)| *t >= b_started && *t <= b_answered)
        .collect();
    eprintln!(
        "B's start took {:.0} ms; alice got {} answers during it ({} after B began), the \
         slowest {:.1} ms ({}); run A's samples during B's start: {:?}",
        b_start * 1e3,
        window.len(),
        answers.iter().filter(|x| x.sent >= b_started).count(),
        slowest.took * 1e3,
        slowest.op,
        during.iter().map(|(_, n)| *n).collect::<Vec<_>>()
    );
    let mut checks = Checks::new();
    checks.check(slowest.took < ANSWER_BOUND.as_secs_f64(), || {
        format!(
            "alice waited {:.0} ms for a {} answer while run B started (bound {} ms)",
            slowest.took * 1e3,
            slowest.op,
            ANSWER_BOUND.as_millis()
        )
    });
    // Not vacuous: the requests overlapped B's start, which took longer than any answer.
    checks.check(!window.is_empty() && b_start > slowest.took, || {
        format!(
            "alice's requests did not overlap B's start ({:.0} ms, {} answers in it)",
            b_start * 1e3,
            window.len()
        )
    });
    // Run A kept being ticked while B started and after (B's own ticks refresh its maps):
    // its count never stood still for a second. A tick is every 100 ms, and even on a loaded
    // machine the busy target takes samples every second.
    let mut last_growth = b_started;
    let mut longest_stall: f64 = 0.0;
    for w in a_samples.windows(2) {
        if w[1].0 >= b_started && w[1].1 > w[0].1 {
            longest_stall = longest_stall.max(w[1].0 - last_growth);
            last_growth = w[1].0;
        }
    }
    let window_end = a_samples.last().map_or(b_started, |r| r.0);
    longest_stall = longest_stall.max(window_end - last_growth);
    eprintln!(
        "run A's count stood still for at most {:.0} ms over {:.1} s from B's start",
        longest_stall * 1e3,
        window_end - b_started
    );
    checks.check(longest_stall < 1.0, || {
        format!(
            "run A's samples stood still for {:.0} ms while B started or ran: {:?}",
            longest_stall * 1e3,
            a_samples
                .iter()
                .filter(|(t, _)| *t >= b_started)
                .map(|(t, n)| (((t - b_started) * 1e3) as u64, *n))
                .collect::<Vec<_>>()
        )
    });

    // Stopping the run on the huge library answers at once, and its results follow.
    let mut root = daemon.client();
    root.set_io_timeout(Duration::from_secs(20));
    let mut costs = Vec::new();
    for (name, id) in [("B", b), ("A", a)] {
        let asked = Instant::now();
        let stopped = match root.stop(id) {
            Ok(reply) => reply,
            Err(e) => {
                checks.check(false, || format!("stopping run {name}: {e}"));
                break;
            }
        };
        let stop_took = asked.elapsed();
        let results = match root.results(id, Duration::from_secs(10)) {
            Ok(reply) => reply,
            Err(e) => {
                checks.check(false, || format!("results of run {name}: {e}"));
                break;
            }
        };
        let results_took = asked.elapsed() - stop_took;
        eprintln!(
            "run {name}: stop answered in {:.1} ms, results in {:.0} ms after it ({} samples)",
            stop_took.as_secs_f64() * 1e3,
            results_took.as_secs_f64() * 1e3,
            results.samples.unwrap_or(0)
        );
        checks.check(stop_took < Duration::from_millis(100), || {
            format!("stopping run {name} took {stop_took:?}")
        });
        checks.eq(
            &format!("run {name}'s state after stop"),
            stopped.state,
            Some(RunState::Processing),
        );
        checks.eq(
            &format!("run {name}'s final state"),
            results.state,
            Some(RunState::Stopped),
        );
        checks.check(results_took < Duration::from_secs(2), || {
            format!("run {name}'s results took {results_took:?} after its stop")
        });
        let summary = results.summary.clone().unwrap_or_default();
        if name == "B" {
            // The huge library's table was built (off every client's path) once B sampled it.
            let untabled = summary["objects_without_unwind_tables"].to_string();
            checks.check(
                !untabled.contains(&*library.file_name().unwrap().to_string_lossy()),
                || format!("run B ended with the huge library still without a table: {untabled}"),
            );
        }
        let cost = summary["cost"].clone();
        checks.eq(
            &format!("run {name}'s cost scope"),
            cost["scope"].as_str(),
            Some("daemon_run"),
        );
        costs.push(cost["profiler_cpu_secs"].as_f64().unwrap_or(0.0));
    }
    // Each run's own CPU, not the daemon's since it started: together they are at most what
    // the daemon used (each would be all of it otherwise). Table builds run on the table
    // thread, no run's.
    if let (&[b_cpu, a_cpu], Some(daemon_cpu)) = (&costs[..], process_cpu_time(daemon.pid())) {
        eprintln!(
            "own CPU: run B {b_cpu:.2}s, run A {a_cpu:.2}s, the daemon {:.2}s",
            daemon_cpu.as_secs_f64()
        );
        checks.check(a_cpu + b_cpu <= daemon_cpu.as_secs_f64() + 0.05, || {
            format!(
                "runs' own CPU ({a_cpu:.2}s + {b_cpu:.2}s) exceeds the daemon's ({daemon_cpu:?})"
            )
        });
    }
    let _ = std::io::stderr().flush();
    checks.finish();
}
