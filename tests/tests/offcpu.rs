//! Off-CPU and wall-clock profiles (`--off-cpu`, `--mode wall`) of the `offcpu` workload,
//! with the real kernel program: worker threads that compute (`compute_phase`), sleep
//! (`sleep_phase`, nanosleep) and block on a pipe (`pipe_phase`, read) in rounds of 5, 3 and
//! 2 ms, and report the wall time they spent in each. The profile must agree with the
//! workload's own clock: on a loaded machine the split moves (compute waits for a CPU, wakeups
//! come late), and the workload measures exactly what moved.

use std::time::Duration;

use bpfprof_tests::*;

/// How long the workload runs: 800 rounds of 10 ms per worker on an idle machine.
const RUN_SECS: &str = "4";
/// How long bpfprof may take, start-up and symbolization on a loaded machine included.
const TIMEOUT: Duration = Duration::from_secs(120);
/// How far (in points of wall time) a phase's share in the profile may be from the
/// workload's own measurement: the profile misses only the waits shorter than
/// `--off-cpu-min` (1 µs) and the time before the workload's threads start.
const SHARE_TOLERANCE: f64 = 0.03;
/// How far the profile's sleep:pipe ratio may be from the workload's, relatively.
const RATIO_TOLERANCE: f64 = 0.10;

/// The workload's own measurement: nanoseconds its workers spent in each phase.
#[derive(Debug)]
struct Split {
    compute: f64,
    sleep: f64,
    pipe: f64,
}

impl Split {
    fn parse(stdout: &str) -> Split {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("compute_ns="))
            .unwrap_or_else(|| panic!("the workload printed no measurement:\n{stdout}"));
        let field = |name: &str| -> f64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        Split {
            compute: field("compute_ns"),
            sleep: field("sleep_ns"),
            pipe: field("pipe_ns"),
        }
    }

    fn total(&self) -> f64 {
        self.compute + self.sleep + self.pipe
    }
}

/// Whether a folded frame is `name`, kernel or not.
fn is(frame: &str, name: &str) -> bool {
    frame.trim_end_matches("_[k]") == name
}

/// Whether a stack is one of the worker threads' (`--per-thread` puts `worker (tid N)` under
/// the process), not a feeder's or the main thread's.
fn on_worker(frames: &[String]) -> bool {
    frames.iter().any(|f| f.starts_with("worker (tid "))
}

/// Runs the workload under bpfprof with `args`; returns the folded profile, the workload's
/// measurement and the summary.
fn profile_workload(args: &[&str]) -> (Profile, Split, Summary) {
    let dir = tempdir();
    let folded = dir.path().join("offcpu.folded");
    let summary = dir.path().join("offcpu.summary.json");
    let workload = workload_path("offcpu");
    let mut argv: Vec<&str> = args.to_vec();
    argv.extend([
        "--per-thread",
        "-o",
        folded.to_str().unwrap(),
        "--summary-json",
        summary.to_str().unwrap(),
        "--",
        workload.to_str().unwrap(),
        RUN_SECS,
    ]);
    let run = run_bpfprof(&argv, TIMEOUT);
    run.assert_code(exit::OK);
    (
        Profile::read(&folded),
        Split::parse(&run.stdout),
        Summary::read(&summary),
    )
}

#[test]
fn wall_mode_shares_match_the_workloads_own_clock() {
    if !require_root() {
        return;
    }
    let (profile, split, summary) = profile_workload(&["--mode", "wall"]);
    let ctx = profile.top(15);
    // Wall mode weighs stacks in nanoseconds: the workers' stacks add up to their wall time.
    let workers = profile.count_where(on_worker) as f64;
    let in_phase = |phase: &str| {
        profile.count_where(|f| on_worker(f) && f.iter().any(|x| is(x, phase))) as f64
    };
    let mut c = Checks::new();
    for (phase, measured) in [
        ("compute_phase", split.compute),
        ("sleep_phase", split.sleep),
        ("pipe_phase", split.pipe),
    ] {
        let share = in_phase(phase) / workers;
        let want = measured / split.total();
        c.check((share - want).abs() <= SHARE_TOLERANCE, || {
            format!(
                "{phase}: {:.1}% of the workers' wall time in the profile, {:.1}% by the \
                 workload's own clock ({split:?})",
                100.0 * share,
                100.0 * want
            )
        });
    }
    // The workers' profiled time is their wall time, less what the profile cannot see.
    c.check(
        workers <= split.total() * 1.02 && workers >= split.total() * 0.9,
        || {
            format!(
                "the workers' stacks add up to {:.3} s, the workload measured {:.3} s",
                workers / 1e9,
                split.total() / 1e9
            )
        },
    );
    let off_cpu = &summary.0["off_cpu"];
    c.check(off_cpu["mode"] == "wall", || {
        format!("summary off_cpu: {off_cpu}")
    });
    if !c.is_ok() {
        eprintln!("{ctx}");
    }
    c.finish();
}

#[test]
fn off_cpu_puts_sleeps_and_pipe_reads_under_their_callers() {
    if !require_root() {
        return;
    }
    let (profile, split, summary) = profile_workload(&["--off-cpu"]);
    let ctx = profile.top(15);
    let mut c = Checks::new();
    // The sleeps: do_nanosleep below sleep_phase, ending off the CPU while sleeping.
    let off_cpu = |f: &[String]| f.last().is_some_and(|l| l == "[off-cpu: sleeping]");
    let sleep = profile.count_where(|f| {
        on_worker(f)
            && off_cpu(f)
            && f.iter().any(|x| is(x, "sleep_phase"))
            && f.iter().any(|x| is(x, "do_nanosleep"))
    }) as f64;
    // The pipe reads: the kernel's pipe read (`pipe_read`, `anon_pipe_read` from 6.14 on)
    // below pipe_phase.
    let pipe = profile.count_where(|f| {
        on_worker(f)
            && off_cpu(f)
            && f.iter().any(|x| is(x, "pipe_phase"))
            && f.iter().any(|x| {
                let name = x.trim_end_matches("_[k]");
                name == "pipe_read" || name == "anon_pipe_read"
            })
    }) as f64;
    c.check(sleep > 0.0 && pipe > 0.0, || {
        format!("sleep {sleep} ns, pipe {pipe} ns")
    });
    let want = split.sleep / split.pipe;
    let got = sleep / pipe.max(1.0);
    c.check((got / want - 1.0).abs() <= RATIO_TOLERANCE, || {
        format!("sleep:pipe {got:.3} in the profile, {want:.3} by the workload ({split:?})")
    });
    // Every off-CPU nanosecond of the workers is one of the two waits (no wait is filed
    // under the wrong caller), and together they are the time the workload measured.
    let workers_off = profile.count_where(|f| on_worker(f) && off_cpu(f)) as f64;
    c.check(sleep + pipe >= 0.98 * workers_off, || {
        format!(
            "of the workers' {workers_off} ns off the CPU only {} are the two waits",
            sleep + pipe
        )
    });
    c.check(
        ((sleep + pipe) / (split.sleep + split.pipe) - 1.0).abs() <= 0.05,
        || {
            format!(
                "the waits add up to {:.3} s in the profile, {:.3} s by the workload",
                (sleep + pipe) / 1e9,
                (split.sleep + split.pipe) / 1e9
            )
        },
    );
    // CPU samples are still there, in nanoseconds, and the summary has the totals.
    c.check(profile.count_containing("compute_phase") > 0, || {
        "no CPU time under compute_phase".to_string()
    });
    let totals = &summary.0["off_cpu"];
    c.check(
        totals["mode"] == "off-cpu"
            && totals["off_cpu_ns"].as_u64().unwrap_or(0) >= (sleep + pipe) as u64
            && totals["off_cpu_ns_by_state"]["preempted"].is_null(),
        || format!("summary off_cpu: {totals}"),
    );
    if !c.is_ok() {
        eprintln!("{ctx}");
    }
    c.finish();
}
