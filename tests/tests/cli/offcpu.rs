//! Off-CPU and wall-clock profiles (`--off-cpu`, `--mode wall`) of the `offcpu` workload,
//! with the real kernel program: worker threads that compute (`compute_phase`), sleep
//! (`sleep_phase`, nanosleep) and block on a pipe (`pipe_phase`, read) in rounds of 5, 3 and
//! 2 ms, and report the wall time they spent in each. The profile must agree with the
//! workload's own clock: on a loaded machine the split moves (compute waits for a CPU, wakeups
//! come late), and the workload measures exactly what moved.

use std::{
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

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

/// The workload's worker threads' name in the first two tests.
const WORKER: &str = "worker";

/// Whether a stack is one of the worker threads' (`--per-thread` puts `NAME (tid N)` under
/// the process), not a feeder's or the main thread's.
fn on_thread(frames: &[String], name: &str) -> bool {
    let prefix = format!("{name} (tid ");
    frames.iter().any(|f| f.starts_with(&prefix))
}

fn on_worker(frames: &[String]) -> bool {
    on_thread(frames, WORKER)
}

/// Whether a frame is the kernel's pipe read (`pipe_read`, `anon_pipe_read` from 6.14 on).
fn is_pipe_read(frame: &str) -> bool {
    let name = frame.trim_end_matches("_[k]");
    name == "pipe_read" || name == "anon_pipe_read"
}

/// A profile of the workload with its measurement and summary, and the directory of its files.
struct Run {
    profile: Profile,
    split: Split,
    summary: Summary,
    dir: tempfile::TempDir,
}

/// Runs the workload (workers named `worker_name`) under bpfprof with `args`, writing
/// `offcpu.folded`, `offcpu.pb.gz` and `offcpu.summary.json`.
fn profile_workload(args: &[&str], worker_name: &str) -> Run {
    let dir = tempdir();
    let folded = dir.path().join("offcpu.folded");
    let pprof = dir.path().join("offcpu.pb.gz");
    let summary = dir.path().join("offcpu.summary.json");
    let svg = dir.path().join("offcpu.svg");
    let pstats = dir.path().join("offcpu.prof");
    let top = dir.path().join("offcpu.txt");
    let workload = workload_path("offcpu");
    let mut argv: Vec<&str> = args.to_vec();
    argv.extend([
        "--per-thread",
        "-o",
        folded.to_str().unwrap(),
        "-o",
        pprof.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
        "-o",
        pstats.to_str().unwrap(),
        "-o",
        top.to_str().unwrap(),
        "--summary-json",
        summary.to_str().unwrap(),
        "--",
        workload.to_str().unwrap(),
        RUN_SECS,
        "2",
        worker_name,
    ]);
    let run = run_bpfprof(&argv, TIMEOUT);
    run.assert_code(exit::OK);
    Run {
        profile: Profile::read(&folded),
        split: Split::parse(&run.stdout),
        summary: Summary::read(&summary),
        dir,
    }
}

/// The total of `sample_index` in a pprof file, as Go's pprof reads it (`Total samples = Nns`).
fn go_pprof_total(file: &Path, sample_index: &str, home: &Path) -> u64 {
    let out = output_ok(
        Command::new("go")
            .args(["tool", "pprof", "-top", "-nodecount=1", "-unit=ns"])
            .arg(format!("-sample_index={sample_index}"))
            .arg(file)
            .env("HOME", home),
        "go tool pprof (golang-go, installed by cargo xtask setup)",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split("Total samples = ").nth(1))
        .and_then(|rest| rest.split("ns").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total in go pprof's output:\n{text}"))
}

#[test]
fn wall_mode_shares_match_the_workloads_own_clock() {
    needs_root!();
    let Run {
        profile,
        split,
        summary,
        ..
    } = profile_workload(&["--mode", "wall"], WORKER);
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
        eprintln!(
            "{phase}: {:.2}% in the profile, {:.2}% by the workload",
            100.0 * share,
            100.0 * want
        );
        c.check((share - want).abs() <= SHARE_TOLERANCE, || {
            format!(
                "{phase}: {:.1}% of the workers' wall time in the profile, {:.1}% by the \
                 workload's own clock ({split:?})",
                100.0 * share,
                100.0 * want
            )
        });
    }
    // The workers' profiled time is their wall time, less what the profile cannot see. Their
    // CPU time is a count of samples of one period each, whose spread (its square root) was
    // as large as the bound's 2%: the upper bound allows three times that spread too (CI:
    // 8.190 s against 8.008, compute_phase 0.9 points over its clock).
    let period_ns = 1e9
        / summary.0["frequency_hz"]
            .as_f64()
            .expect("summary frequency_hz");
    let on_cpu = profile
        .count_where(|f| on_worker(f) && !f.last().is_some_and(|x| x.starts_with("[off-cpu")))
        as f64;
    let spread = 3.0 * (on_cpu / period_ns).sqrt() * period_ns;
    c.check(
        workers <= split.total() * 1.02 + spread && workers >= split.total() * 0.9,
        || {
            format!(
                "the workers' stacks add up to {:.3} s, the workload measured {:.3} s (CPU \
                 samples {:.0}, three times their spread {:.3} s)",
                workers / 1e9,
                split.total() / 1e9,
                on_cpu / period_ns,
                spread / 1e9
            )
        },
    );
    eprintln!(
        "workers {:.3} s, workload {:.3} s, CPU samples {:.0}, 3 sigma {:.3} s",
        workers / 1e9,
        split.total() / 1e9,
        on_cpu / period_ns,
        spread / 1e9
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
    needs_root!();
    let Run {
        profile,
        split,
        summary,
        dir,
    } = profile_workload(&["--off-cpu"], WORKER);
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
            && f.iter().any(|x| is_pipe_read(x))
    }) as f64;
    c.check(sleep > 0.0 && pipe > 0.0, || {
        format!("sleep {sleep} ns, pipe {pipe} ns")
    });
    let want = split.sleep / split.pipe;
    let got = sleep / pipe.max(1.0);
    eprintln!("sleep:pipe {got:.3} in the profile, {want:.3} by the workload");
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
    // pprof, read by Go's own pprof: the off_cpu and cpu sample types add up to the totals.
    let pprof = dir.path().join("offcpu.pb.gz");
    for (index, key) in [("off_cpu", "off_cpu_ns"), ("cpu", "cpu_ns")] {
        let got = go_pprof_total(&pprof, index, dir.path());
        c.eq(
            &format!("pprof {index} total"),
            got,
            totals[key].as_u64().unwrap_or(0),
        );
    }
    // Python's own pstats: sleep_phase's cumulative time is its wait plus its few samples.
    let cumtime: f64 = run_pstats(
        &dir.path().join("offcpu.prof"),
        "import pstats, sys\n\
         s = pstats.Stats(sys.argv[1])\n\
         print(sum(v[3] for k, v in s.stats.items() if k[2] == 'sleep_phase'))",
    )
    .trim()
    .parse()
    .expect("a number from pstats");
    let sleep_phase = profile.count_containing("sleep_phase") as f64 / 1e9;
    c.check((cumtime - sleep_phase).abs() <= 0.01 * sleep_phase, || {
        format!(
            "pstats: sleep_phase {cumtime:.3} s cumulative, the folded stacks {sleep_phase:.3} s"
        )
    });
    // The top table splits each function's total into CPU and wait: sleep_phase waits.
    let table = std::fs::read_to_string(dir.path().join("offcpu.txt")).expect("the table");
    let row: Vec<u64> = table
        .lines()
        .find(|l| l.ends_with("[.] sleep_phase"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // self, total, cpu, wait (the percentages do not parse as integers).
    c.check(
        row.len() == 4 && row[3] + row[2] == row[1] && row[3] as f64 >= 0.95 * row[1] as f64,
        || format!("sleep_phase's row {row:?} in:\n{table}"),
    );
    // The flame graph draws the waits in their own colour.
    let svg = std::fs::read_to_string(dir.path().join("offcpu.svg")).expect("the SVG");
    let wait_frame = svg
        .split("<g>")
        .find(|g| g.contains("<title>[off-cpu: sleeping]"))
        .unwrap_or_default();
    c.check(wait_frame.contains("fill=\"rgb(90,140,230)\""), || {
        format!("the [off-cpu: sleeping] frame is not drawn in the off-CPU blue: {wait_frame}")
    });
    if !c.is_ok() {
        eprintln!("{ctx}");
    }
    c.finish();
}

/// The off-CPU time a bpftrace script on `sched:sched_switch` sums per kernel stack, for the
/// threads named `name` (the same rule as bpfprof's: interruptible or uninterruptible sleeps,
/// not preemption, at least 1 µs).
const BPFTRACE_SCRIPT: &str = r#"
tracepoint:sched:sched_switch
{
  if (args->prev_comm == str($1) && (args->prev_state & 3) != 0 && (args->prev_state & 0x100) == 0) {
    @start[args->prev_pid] = nsecs;
    @stack[args->prev_pid] = kstack;
  }
  $next = args->next_pid;
  $since = @start[$next];
  if ($since != 0) {
    $d = nsecs - $since;
    if ($d >= 1000) {
      @off[@stack[$next]] = sum($d);
    }
    delete(@start[$next]);
    delete(@stack[$next]);
  }
}
END { clear(@start); clear(@stack); }
"#;

/// Picks the frames of one kind of wait.
type FramePredicate = dyn Fn(&str) -> bool;

/// bpftrace's `@off[kstack]: N` entries: (kernel function names leaf first, nanoseconds).
fn parse_bpftrace(out: &str) -> Vec<(Vec<String>, u64)> {
    let mut entries = Vec::new();
    let mut frames: Option<Vec<String>> = None;
    for line in out.lines() {
        let line = line.trim();
        if line.starts_with("@off[") {
            frames = Some(Vec::new());
        } else if let Some(rest) = line.strip_prefix("]: ") {
            if let (Some(f), Ok(n)) = (frames.take(), rest.trim().parse()) {
                entries.push((f, n));
            }
        } else if let Some(f) = frames.as_mut() {
            let name = line.split('+').next().unwrap_or(line);
            f.push(name.to_string());
        }
    }
    entries
}

#[test]
fn off_cpu_agrees_with_bpftrace_on_the_same_run() {
    needs_root!();
    // Workers of their own name: the other tests' workloads, running beside, are not counted.
    const NAME: &str = "offcpu-cmp";
    let mut tracer = Command::new("bpftrace")
        .args(["-e", BPFTRACE_SCRIPT, NAME])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bpftrace (installed by cargo xtask setup)");
    let mut stdout = BufReader::new(tracer.stdout.take().expect("piped stdout"));
    // bpftrace says so once its probes are attached.
    let mut line = String::new();
    while !line.starts_with("Attaching") {
        line.clear();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            let mut err = String::new();
            let _ = tracer.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("bpftrace ended before attaching: {err}");
        }
    }
    let run = profile_workload(&["--off-cpu", "--bpf-stats"], NAME);
    // SIGINT: bpftrace prints its maps and exits.
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let mut out = String::new();
    stdout.read_to_string(&mut out).expect("bpftrace's output");
    let _ = tracer.wait();
    let traced = parse_bpftrace(&out);
    let ctx = run.profile.top(15);
    let mut c = Checks::new();
    // Both tools' waits by kind: the sleep (do_nanosleep) and the pipe read.
    let traced_total = |pred: &dyn Fn(&str) -> bool| -> f64 {
        traced
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| pred(f)))
            .map(|(_, n)| *n as f64)
            .sum()
    };
    let profiled_total = |pred: &dyn Fn(&str) -> bool| -> f64 {
        run.profile.count_where(|f| {
            on_thread(f, NAME)
                && f.last().is_some_and(|l| l.starts_with("[off-cpu: "))
                && f.iter().any(|x| pred(x))
        }) as f64
    };
    let sleep = |f: &str| f.trim_end_matches("_[k]") == "do_nanosleep";
    let kinds: [(&str, &FramePredicate); 2] =
        [("do_nanosleep", &sleep), ("pipe read", &is_pipe_read)];
    let mut order = Vec::new();
    for (what, pred) in kinds {
        let (traced, profiled) = (traced_total(pred), profiled_total(pred));
        c.check(
            traced > 0.0 && (profiled / traced - 1.0).abs() <= 0.05,
            || {
                format!(
                    "{what}: bpfprof {:.3} s, bpftrace {:.3} s\nbpftrace:\n{out}",
                    profiled / 1e9,
                    traced / 1e9
                )
            },
        );
        order.push((what, traced, profiled));
    }
    eprintln!("(wait, bpftrace ns, bpfprof ns): {order:?}");
    // The same top blocked stack in both: the one with the most time.
    c.check(
        (order[0].1 > order[1].1) == (order[0].2 > order[1].2),
        || format!("the tools disagree on the top blocked stack: {order:?}"),
    );
    // Every wait of the workers that bpftrace saw is one of the two.
    let all_traced: f64 = traced.iter().map(|(_, n)| *n as f64).sum();
    c.check(order[0].1 + order[1].1 >= 0.98 * all_traced, || {
        format!("bpftrace saw other waits: {out}")
    });
    // --bpf-stats measures the off-CPU program too: it ran at least once per interval it
    // recorded (each is a switch-in), for some time.
    let cost = &run.summary.0["cost"];
    let intervals = run.summary.0["off_cpu"]["off_cpu_intervals"]
        .as_u64()
        .unwrap_or(0);
    let (runs, ns) = (
        cost["off_cpu_bpf_run_count"].as_u64().unwrap_or(0),
        cost["off_cpu_bpf_run_time_ns"].as_u64().unwrap_or(0),
    );
    c.check(intervals > 0 && runs >= intervals && ns > 0, || {
        format!("off-CPU program stats: {runs} runs, {ns} ns for {intervals} intervals: {cost}")
    });
    if !c.is_ok() {
        eprintln!("{ctx}");
    }
    c.finish();
}

/// A folded frame's function: Python frames may carry `(file:line)`.
fn function(frame: &str) -> &str {
    frame.split_once(" (").map_or(frame, |(name, _)| name)
}

#[test]
fn python_waits_appear_under_their_python_callers() {
    needs_root!();
    let script = workspace_root().join("tests/workloads/pyoffcpu.py");
    let mut failures = Vec::new();
    for python in pyenv_cpythons() {
        let mut cmd = Command::new(&python);
        cmd.arg(&script).arg("30");
        let target = Workload::spawn_command(cmd);
        // Past start-up: the threads run their loops.
        std::thread::sleep(Duration::from_millis(800));
        let dir = tempdir();
        let profile = profile_pid(target.pid(), "3s", &["--off-cpu"], dir.path());
        let has = |f: &[String], name: &str| f.iter().any(|x| function(x) == name);
        let off_cpu = |f: &[String]| f.last().is_some_and(|l| l == "[off-cpu: sleeping]");
        // time.sleep() sleeps in clock_nanosleep (3.11 on) or select (3.10).
        let sleeps = |f: &[String]| {
            f.iter()
                .any(|x| is(x, "do_nanosleep") || is(x, "do_select"))
        };
        // queue.get() waits on a lock: a futex in the kernel, below wait_for_item (3.10's
        // code objects have no qualified names: `get`).
        let queue_wait = profile.count_where(|f| {
            off_cpu(f)
                && has(f, "wait_for_item")
                && (has(f, "Queue.get") || has(f, "get"))
                && f.iter().any(|x| x.starts_with("futex_wait"))
        });
        let nap = profile.count_where(|f| off_cpu(f) && has(f, "nap") && sleeps(f));
        // Every wait of the worker is one of those two, and the producer's sleep is its own.
        let worker = profile.count_where(|f| off_cpu(f) && has(f, "work"));
        let misfiled = profile.count_where(|f| has(f, "produce") && has(f, "nap"));
        let produce = profile.count_where(|f| off_cpu(f) && has(f, "produce") && sleeps(f));
        let line = format!(
            "{}: queue.get {:.3} s, sleep {:.3} s, worker off-CPU {:.3} s, producer sleep \
             {:.3} s, misfiled {misfiled}",
            python.display(),
            queue_wait as f64 / 1e9,
            nap as f64 / 1e9,
            worker as f64 / 1e9,
            produce as f64 / 1e9
        );
        eprintln!("{line}");
        // In 3 s the worker waits about 1.5 s in each (the producer's 20 ms cadence less the
        // 10 ms nap): at least 0.5 s each however loaded the machine is, at most 2:1 apart.
        let ok = queue_wait >= 500_000_000
            && nap >= 500_000_000
            && queue_wait.max(nap) <= 2 * queue_wait.min(nap)
            && (queue_wait + nap) as f64 >= 0.95 * worker as f64
            && produce >= 1_000_000_000
            && misfiled == 0;
        if !ok {
            failures.push(format!("{line}\n{}", profile.top(12)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn system_wide_off_cpu_names_the_waits_of_a_process_it_finds() {
    needs_root!();
    // Workers of their own name, and a process bpfprof learns of from the kernel.
    const NAME: &str = "offcpu-all";
    let target = Workload::spawn("offcpu", &["60", "2", NAME]);
    std::thread::sleep(Duration::from_millis(300));
    let dir = tempdir();
    let folded = dir.path().join("all.folded");
    let run = run_bpfprof(
        [
            "-a",
            "--off-cpu",
            "--per-thread",
            "-d",
            "3s",
            "-o",
            folded.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OK);
    drop(target);
    let profile = Profile::read(&folded);
    let waits = |phase: &str, kernel: &dyn Fn(&str) -> bool| {
        profile.count_where(|f| {
            on_thread(f, NAME)
                && f.last().is_some_and(|l| l == "[off-cpu: sleeping]")
                && f.iter().any(|x| is(x, phase))
                && f.iter().any(|x| kernel(x))
        }) as f64
            / 1e9
    };
    let sleep = waits("sleep_phase", &|x| is(x, "do_nanosleep"));
    let pipe = waits("pipe_phase", &is_pipe_read);
    let unnamed = profile.count_where(|f| {
        on_thread(f, NAME)
            && f.iter()
                .any(|x| x == "[user code: exited before its maps were read]")
    });
    eprintln!("system-wide: sleep {sleep:.3} s, pipe {pipe:.3} s, unnamed {unnamed} ns");
    // Two workers for 3 s wait about 30% and 20% of it: well above these however loaded.
    assert!(
        sleep >= 0.5 && pipe >= 0.3 && unnamed == 0,
        "sleep {sleep:.3} s, pipe {pipe:.3} s, unnamed {unnamed} ns\n{}",
        profile.top(15)
    );
}

#[test]
fn a_daemon_run_takes_the_mode() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let target = Workload::spawn("offcpu", &["60", "2", "offcpu-daemon"]);
    let pid = format!("{}:{}", pid_ns_inode(target.pid()), target.pid());
    // A mode the daemon does not know is refused, saying which there are.
    let refused = daemon.cli(&["run", "--pid", &pid, "--mode", "idle"]);
    refused.assert_code(exit::INVALID_SAMPLING);
    refused.assert_stderr_mentions(&["cpu or wall"]);
    let run = daemon.cli(&[
        "run",
        "--async",
        "--pid",
        &pid,
        "--mode",
        "wall",
        "--duration-ms",
        "3000",
        "--formats",
        "folded,summary-json",
    ]);
    let id = bpfprof_tests::hostile::run_id_of(&run).to_string();
    let results = daemon.cli(&["results", "--run-id", &id, "--wait", "60s", "--json"]);
    results.assert_code(0);
    let reply: serde_json::Value = serde_json::from_str(&results.stdout).unwrap();
    let file = |format: &str| {
        reply["files"][format]
            .as_str()
            .unwrap_or_else(|| panic!("no {format}: {reply:#}"))
            .to_string()
    };
    let profile = Profile::read(Path::new(&file("folded")));
    let summary = Summary::read(Path::new(&file("summary-json")));
    let phase = |name: &str| profile.count_containing(name) as f64 / 1e9;
    let (compute, sleep, pipe) = (
        phase("compute_phase"),
        phase("sleep_phase"),
        phase("pipe_phase"),
    );
    let duration = summary.f64("duration_secs");
    eprintln!(
        "daemon wall run of {duration:.2} s: compute {compute:.3} s, sleep {sleep:.3} s, \
         pipe {pipe:.3} s"
    );
    let mut c = Checks::new();
    c.check(summary.0["off_cpu"]["mode"] == "wall", || {
        format!("summary: {}", summary.0)
    });
    // Wall mode: the two workers' phases add up to their wall time over the run (the
    // rounds' bookkeeping between phases is all that is missing).
    let workers = compute + sleep + pipe;
    c.check(
        workers >= 0.9 * 2.0 * duration && workers <= 1.02 * 2.0 * duration,
        || format!("the workers' phases add up to {workers:.3} s in a {duration:.2} s run"),
    );
    // The sleep is 3 ms and the pipe wait 2 ms a round, each stretched alike by late wakeups.
    c.check((1.2..=1.8).contains(&(sleep / pipe.max(1e-9))), || {
        format!("sleep:pipe {:.3}", sleep / pipe.max(1e-9))
    });
    if !c.is_ok() {
        eprintln!("{}", profile.top(15));
    }
    c.finish();
}

#[test]
fn the_agent_serves_a_containers_waits_under_their_callers() {
    use bpfprof_tests::agent::{free_port, go_pprof_url_typed, metrics, start_agent, TestCgroup};
    needs_root!();
    // The workload alone in a cgroup (a container, to the agent), for long enough that the
    // agent's windows fall inside its run; it measures its own split when it ends.
    const NAME: &str = "offcpu-agent";
    const SECS: u64 = 30;
    let cgroup = TestCgroup::named(&format!("bpfprof-offcpu-agent-{}", std::process::id()));
    let mut workload = Command::new(workload_path("offcpu"))
        .args([&SECS.to_string(), "2", NAME])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the offcpu workload");
    cgroup.add(workload.id());
    let pid = workload.id();
    let port = free_port();
    let agent = start_agent(
        port,
        &[
            "--cgroup",
            &cgroup.relative,
            "--off-cpu",
            "-F",
            "99",
            "--window",
            "1s",
        ],
        2.0,
    );
    let dir = tempdir();
    // Judged by the waits recorded: a loaded machine may need more windows for enough.
    let mut seconds = 4;
    let (types, samples) = loop {
        let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}");
        let Some((types, samples)) = go_pprof_url_typed(&url, dir.path()) else {
            let _ = workload.kill();
            let _ = workload.wait();
            return;
        };
        let waits = samples.iter().filter(|s| s.frames.len() > 1).count();
        if waits >= 50 || seconds >= 16 {
            break (types, samples);
        }
        std::thread::sleep(Duration::from_secs(2));
        seconds += 4;
    };
    let agent_metrics = metrics(port);
    drop(agent);
    let mut stdout = String::new();
    workload
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(workload.wait().unwrap().success());
    let split = Split::parse(&stdout);

    // The window's pprof carries the off-CPU time as a sample type of its own, in nanoseconds.
    let off_cpu = types
        .iter()
        .position(|t| t == "off_cpu/nanoseconds")
        .unwrap_or_else(|| panic!("no off_cpu/nanoseconds sample type in {types:?}"));
    let of_pid =
        |s: &&bpfprof_tests::agent::RawSample| s.labels.get("pid") == Some(&pid.to_string());
    let has = |s: &bpfprof_tests::agent::RawSample, f: &dyn Fn(&str) -> bool| {
        s.frames.iter().any(|x| f(x))
    };
    let wait_ns = |phase: &str, kernel: &dyn Fn(&str) -> bool| -> f64 {
        samples
            .iter()
            .filter(of_pid)
            .filter(|s| has(s, &|x| x == phase) && has(s, kernel))
            .map(|s| s.values[off_cpu] as f64)
            .sum()
    };
    let sleep = wait_ns("sleep_phase", &|x| x == "do_nanosleep");
    let pipe = wait_ns("pipe_phase", &is_pipe_read);
    let all_off: f64 = samples
        .iter()
        .filter(of_pid)
        .map(|s| s.values[off_cpu] as f64)
        .sum();
    let compute = samples
        .iter()
        .filter(of_pid)
        .filter(|s| has(s, &|x| x == "compute_phase"))
        .map(|s| s.count)
        .sum::<u64>();
    let want = split.sleep / split.pipe;
    let got = sleep / pipe.max(1.0);
    eprintln!(
        "agent: sleep {:.3} s, pipe {:.3} s, all off-CPU {:.3} s, compute samples {compute}; \
         sleep:pipe {got:.3}, the workload's {want:.3}",
        sleep / 1e9,
        pipe / 1e9,
        all_off / 1e9
    );
    let mut c = Checks::new();
    // Two workers wait about half of each window: at least a second of each wait however
    // loaded the machine, named by the kernel's frames under the workload's own functions.
    c.check(sleep >= 1e9 && pipe >= 0.6e9, || {
        format!("sleep {sleep} ns, pipe {pipe} ns")
    });
    // The split of the windows is the workload's own (its whole run; the windows are part).
    c.check((got / want - 1.0).abs() <= 0.15, || {
        format!("sleep:pipe {got:.3} in the agent's windows, {want:.3} by the workload ({split:?})")
    });
    // CPU samples stay samples, beside the waits.
    c.check(compute > 0, || "no CPU sample under compute_phase".into());
    // Nothing outside the container: the cgroup filter holds for waits too.
    let strays: Vec<&String> = samples
        .iter()
        .filter_map(|s| s.labels.get("pid"))
        .filter(|p| **p != pid.to_string())
        .collect();
    c.check(strays.is_empty(), || {
        format!("samples of other processes: {strays:?}")
    });
    // /metrics counts the time recorded off the CPU.
    let off_seconds = agent_metrics
        .get("bpfprof_agent_off_cpu_seconds_total")
        .copied()
        .unwrap_or(0.0);
    c.check(off_seconds >= (sleep + pipe) / 1e9 * 0.5, || {
        format!("bpfprof_agent_off_cpu_seconds_total {off_seconds}")
    });
    c.finish();
}

/// A Python program that blocks 300 times (2 ms sleeps), then prints how many times the kernel
/// switched it out (`ru_nvcsw + ru_nivcsw`, its own count of every `sched_switch` it was the
/// outgoing task of, up to that point).
const SWITCHING_PROGRAM: &str = "\
import resource, time
for _ in range(300):
    time.sleep(0.002)
r = resource.getrusage(resource.RUSAGE_SELF)
print('switches', r.ru_nvcsw + r.ru_nivcsw)
";

/// Other tools still see `sched:sched_switch` while an off-CPU run is on: bpfprof's
/// tracepoint program returned 0, which makes the kernel drop the event for every perf
/// event on the tracepoint, machine-wide (`perf record -e sched:sched_switch -a` counted 0
/// beside an off-CPU run). `perf stat` counts the program's switches beside a run that
/// profiles it, and must find at least the switches the kernel counted for it (a few more:
/// those of its exit and of perf's child before the exec).
#[test]
fn perf_still_counts_sched_switch_beside_an_off_cpu_run() {
    needs_root!();
    let Some(perf) = find_tool("perf") else {
        assert!(
            !ci(),
            "perf is needed under CI (linux-perf, installed by cargo xtask setup)"
        );
        eprintln!("skipping: no perf");
        return;
    };
    let dir = tempdir();
    let counts = dir.path().join("perf.csv");
    let folded = dir.path().join("offcpu.folded");
    let python = if find_tool("python3").is_some() {
        "python3"
    } else {
        "python"
    };
    let run = run_bpfprof(
        [
            "--off-cpu",
            "-o",
            folded.to_str().unwrap(),
            "--",
            perf.to_str().unwrap(),
            "stat",
            "-x",
            ",",
            "-e",
            "sched:sched_switch",
            "-o",
            counts.to_str().unwrap(),
            "--",
            python,
            "-c",
            SWITCHING_PROGRAM,
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OK);
    let own: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("switches "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the program printed no count:\n{}", run.stdout));
    let csv = std::fs::read_to_string(&counts).expect("perf stat's output");
    let counted: u64 = csv
        .lines()
        .find(|l| l.contains("sched:sched_switch"))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sched_switch count in perf stat's output:\n{csv}"));
    // The run did profile the waits: its program was on while perf counted.
    let profile = Profile::read(&folded);
    let waited = profile.count_where(|f| f.iter().any(|x| x == "[off-cpu: sleeping]"));
    eprintln!("perf counted {counted} switches, the program {own}; {waited} ns off the CPU");
    assert!(
        waited > 0,
        "the run recorded no off-CPU time:\n{}",
        profile.top(10)
    );
    // At least 300 sleeps; perf sees every switch the kernel counted (it counted 0), and not
    // many more (the exec, the interpreter's exit, perf's own child before its exec).
    assert!(own >= 300, "the program counted {own} switches");
    assert!(
        counted + 10 >= own && counted <= own + own / 2 + 200,
        "perf counted {counted} sched_switch events of the program, which counted {own} \
         switches itself"
    );
}
