//! `cargo xtask bench`: bpfprof side by side with `perf record -g` and `bpftrace` on the same
//! workloads, in the same run, reported as ratios and errors; writes `BENCHMARKS.md` and
//! `bench/overhead.svg`.
//!
//! These are benchmarks, never timed tests: nothing here fails because a number is bad. Every
//! figure is a median over rounds with its min–max spread, and within a round the profilers run
//! in a rotated order so that drifts of a shared machine hit them all alike.
//!
//! The workloads are the C programs in `bench/` (see `bench/README.md`) plus one generated here
//! (a large binary with thousands of functions, for the end-of-run cost). Everything is
//! sampled with `cpu-clock`: the machine this was written on has no hardware PMU, and the three
//! profilers then all ride the same software hrtimer, which makes the comparison like for like.
//!
//! The three profilers' stacks are reduced to one form, folded stacks without the process name
//! (`root;...;leaf`, kernel frames suffixed `_[k]`): bpfprof writes it, `perf script` output is
//! folded with `inferno`, and bpftrace's printed map is parsed here (inferno has no bpftrace
//! collapser).

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fmt::Write as _,
    fs::{self, File},
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use serde_json::Value;

mod unwind;

/// Options of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// One round at fewer frequencies: a smoke run.
    #[arg(long)]
    pub quick: bool,
}

/// Debian packages the bench runs or builds with.
const TOOLS: &[&str] = &["linux-perf", "bpftrace", "gcc"];

/// Flags for every workload: frame pointers everywhere (all three profilers walk user stacks
/// by frame pointer; see `keep_frame` in `bench/common.h` for the leaves), no shrink-wrapping
/// (the frame must be set up before a leaf's loop, not only around its last call), no tail
/// calls (a `jmp` to a callee would drop the caller's frame), and no identical-code folding
/// (two functions with the same body must stay two symbols).
const CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-shrink-wrap",
    "-fno-optimize-sibling-calls",
    "-fno-ipa-icf",
    "-pthread",
];

/// Flags for the generated large binary. -O0: at -O2, gcc takes over two minutes for its
/// thousands of functions on a 2-CPU machine, and the optimization level does not matter to
/// what the binary is for (symbolizing many frames of a big executable with debug info); -O0
/// also gives every function, leaves included, its frame.
const BIG_CFLAGS: &[&str] = &["-O0", "-g", "-fno-omit-frame-pointer", "-pthread"];

/// Iterations per thread of the overhead workload: about 1.5 s on the machine this was
/// written on, long enough that start-up jitter is small against it.
const BURN_ITERS: &str = "1100000000";
/// Chunks of the 75:25 accuracy workload: about 3 s.
const SPLIT_CHUNKS: &str = "20000";
/// 10 ms periods of the aliasing workload: 3 s.
const ALIAS_PERIODS: &str = "300";
/// How long the attached runs (sections 4 to 6) sample.
const ATTACH_SECS: f64 = 3.0;
/// Extra frames of `burn` for the deep-stack overhead runs.
const DEEP_DEPTH: usize = 120;
/// Shape of the generated large binary: levels of the call tree, functions per level.
const BIG_LEVELS: usize = 48;
const BIG_PER_LEVEL: usize = 100;
/// Watchdog for any one profiler run: far above what a run takes, so only a hang trips it.
const RUN_LIMIT: Duration = Duration::from_secs(300);
/// Longest a launch-mode run may take: their workloads run for seconds.
const LAUNCH_LIMIT: Duration = Duration::from_secs(60);

/// The profilers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tool {
    Bpfprof,
    /// bpfprof with its sampling-interval randomization turned off.
    BpfprofFixed,
    Perf,
    Bpftrace,
}

impl Tool {
    fn is_bpfprof_like(self) -> bool {
        matches!(self, Tool::Bpfprof | Tool::BpfprofFixed)
    }

    fn name(self) -> &'static str {
        match self {
            Tool::Bpfprof => "bpfprof",
            Tool::BpfprofFixed => "bpfprof --fixed-interval",
            Tool::Perf => "perf record -g",
            Tool::Bpftrace => "bpftrace",
        }
    }
}

/// The three profilers every section compares.
const TOOLS_COMPARED: [Tool; 3] = [Tool::Bpfprof, Tool::Perf, Tool::Bpftrace];

/// What a full or quick run measures.
struct Plan {
    quick: bool,
    rounds: usize,
    overhead_hz: Vec<u64>,
    accuracy_hz: Vec<u64>,
    alias_hz: Vec<u64>,
    rate_hz: Vec<u64>,
    own_cost_hz: Vec<u64>,
    /// Distinct call paths of the large binary for the memory ladder (0: unlimited).
    path_limits: Vec<u64>,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                rounds: 1,
                overhead_hz: vec![999],
                accuracy_hz: vec![999],
                alias_hz: vec![100],
                rate_hz: vec![4999],
                own_cost_hz: vec![999],
                path_limits: vec![1000],
            }
        } else {
            Plan {
                quick,
                rounds: 5,
                overhead_hz: vec![99, 999, 4999],
                accuracy_hz: vec![99, 999, 4999],
                alias_hz: vec![97, 100, 101, 1000],
                rate_hz: vec![999, 4999, 9999, 19999],
                own_cost_hz: vec![999, 4999],
                path_limits: vec![100, 1000, 10000],
            }
        }
    }

    /// Overhead figures are the noisiest: they get more rounds.
    fn overhead_rounds(&self) -> usize {
        if self.quick {
            1
        } else {
            9
        }
    }
}

/// One way of running the overhead workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Arm {
    Alone,
    /// bpfprof sampling an idle process meanwhile: the cost of the timers alone.
    Floor,
    /// `perf record -a -g`: perf with per-CPU events, as bpfprof and bpftrace use.
    PerfSystemWide,
    Under(Tool),
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Alone => "alone",
            Arm::Floor => "timer floor (bpfprof watching an idle process)",
            Arm::PerfSystemWide => "perf record -a -g (per-CPU events, whole system)",
            Arm::Under(tool) => tool.name(),
        }
    }
}

/// Section 1's figures.
#[derive(Default)]
struct Overhead {
    /// Seconds of the workload alone, by frequency.
    alone: BTreeMap<u64, Vec<f64>>,
    /// Time under each arm / time alone in the same round.
    ratios: BTreeMap<(Arm, u64), Vec<f64>>,
}

/// Folded stacks, `root;...;leaf` without the process name, to sample counts.
type Stacks = BTreeMap<String, u64>;

/// CPU time of a process and the children it reaped (from `wait4`), and its memory (from
/// `/proc/PID/status`, see [`Monitor`]).
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    cpu_secs: f64,
    max_rss_kib: f64,
    /// RSS at the last look before the process exited.
    last_rss_kib: f64,
}

/// The cost of turning perf's data into stacks: `perf script`, then folding its text.
#[derive(Clone, Copy, Debug, Default)]
struct PostCost {
    secs: f64,
    usage: Usage,
}

/// What a profiler left behind after an attached run.
struct Attached {
    stacks: Stacks,
    /// The profiler process over its whole life.
    usage: Usage,
    /// From SIGINT to the profiler's exit, its profile written.
    stop_secs: f64,
    /// perf only: `perf script` and folding.
    post: Option<PostCost>,
    /// bpfprof only: its `--summary-json`.
    summary: Option<Value>,
    /// Samples the profiler saw but did not keep, when it can tell (see [`drops`]).
    drops: Option<u64>,
    /// Samples the profiler's kernel side saw (bpftrace's `@n` counter), when counted.
    fired: Option<u64>,
    /// bpftrace only, with BPF statistics on: (run time ns, run count) of its program.
    bpf_stats: Option<(u64, u64)>,
    /// Seconds between the first and last sample (perf only).
    span_secs: Option<f64>,
    /// CPUs the target kept busy, on average, while the profiler ran.
    target_cpus: Option<f64>,
}

/// What one launched command (a profiler with its workload, or the workload alone) left.
struct Launched {
    /// The workload's stdout lines.
    lines: Vec<String>,
    /// CLOCK_MONOTONIC just before the command was spawned.
    spawned_ns: u64,
    stacks: Stacks,
}

impl Launched {
    /// The value of the workload's `KEY VALUE` line.
    fn value(&self, key: &str) -> Result<f64> {
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .with_context(|| format!("the workload printed no `{key}` line: {:?}", self.lines))?
            .trim()
            .parse()
            .with_context(|| format!("the workload's `{key}` line"))
    }
}

/// Options of an attached run.
#[derive(Clone, Copy, Default)]
struct AttachOpts {
    /// bpftrace: also count every sample its probe fires for (`@n`), to count its drops.
    count_fired: bool,
    /// Measure the kernel program's run time (bpfprof `--bpf-stats`; for bpftrace, BPF
    /// statistics are turned on around the run).
    bpf_stats: bool,
    /// bpftrace: exit on its own after this many seconds (gives it a known duration).
    bpftrace_exit_after: Option<u64>,
}

/// An attached profiler, running.
struct Running {
    tool: Tool,
    child: Child,
    monitor: Monitor,
    /// The target and its CPU time when the profiler started.
    target: (i32, Option<f64>, Instant),
    out: PathBuf,
    stderr: PathBuf,
    opts: AttachOpts,
    stats_guard: Option<BpfStatsGuard>,
}

struct Bench {
    root: PathBuf,
    dir: PathBuf,
    bpfprof: PathBuf,
    /// Whether this bpfprof has `--fixed-interval` (its sampling is randomized by default).
    has_fixed: bool,
    cpus: usize,
    /// The TSC rate `bench/startup.c` is given (see there).
    tsc_per_ns: std::cell::OnceCell<String>,
    /// Every bpfprof summary's losses, so that none goes unreported.
    bpfprof_losses: std::cell::RefCell<BTreeMap<String, u64>>,
    /// What the sections found, for the closing "why" section.
    findings: std::cell::RefCell<Findings>,
    /// How long the kernel took to verify the CFI/Python walker program, as `bpfprof doctor`
    /// measures it (median (min–max) over a few loads, in ms): the text that cites it.
    walker_verify_ms: String,
}

/// Entry point of `cargo xtask bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "the bench loads BPF programs and opens system-wide perf events: run it as root"
    );
    let started = Instant::now();
    let plan = Plan::new(args.quick);
    install_tools()?;
    let root = crate::cmd::workspace_root();
    println!("==> building bpfprof (release)");
    crate::cmd::run(crate::cmd::cargo().args(["build", "--release", "-p", "profiler-user"]))?;

    let dir = root.join("target/bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Two benches at once would each measure the other: take turns.
    let lock_path = dir.join(".lock");
    let lock = File::create(&lock_path)?;
    if lock.try_lock().is_err() {
        println!("    waiting for another `cargo xtask bench` to finish");
        lock.lock()?;
    }

    let bpfprof = root.join("target/release/bpfprof");
    let help = crate::cmd::probe(Command::new(&bpfprof).arg("--help")).unwrap_or_default();
    let walker_verify_ms = stat(&walker_verify_ms(&bpfprof, plan.rounds)?, 0);
    println!("    the walker program verifies in {walker_verify_ms} ms");
    let bench = Bench {
        has_fixed: help.contains("--fixed-interval"),
        root,
        dir,
        bpfprof,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        tsc_per_ns: Default::default(),
        bpfprof_losses: Default::default(),
        findings: Default::default(),
        walker_verify_ms,
    };
    bench.compile_workloads()?;

    let mut md = String::new();
    writeln!(md, "# bpfprof benchmarks\n")?;
    writeln!(
        md,
        "Made by `cargo xtask bench{}` (reproduce with that one command, as root). {}\n",
        if plan.quick { " --quick" } else { "" },
        bench.machine()?
    )?;
    // The machine is shared: the load average says how much else ran (filled in at the end).
    let load_at_start = unwind::load_average();
    writeln!(
        md,
        "Load average (1 min) when the bench started: {load_at_start}; LOAD_AT_END\n"
    )?;
    if plan.quick {
        writeln!(md, "**Quick run**: one round, one frequency per section; a smoke run, not figures to quote.\n")?;
    }
    if !bench.has_fixed {
        writeln!(md, "This bpfprof has no `--fixed-interval`: its sampling interval is fixed, and the randomized/fixed comparison is left out.\n")?;
    }

    // A developer aid: BPFPROF_BENCH_ONLY=3,4 runs only those sections and writes the result
    // to target/bench/BENCHMARKS.partial.md instead of BENCHMARKS.md.
    let only: Option<Vec<u32>> = std::env::var("BPFPROF_BENCH_ONLY")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    let want = |n: u32| only.as_ref().is_none_or(|o| o.contains(&n));
    let mut sections = String::new();
    let mut verdicts = Vec::new();
    let mut overhead = Overhead::default();
    if want(1) {
        overhead = bench.overhead(&plan, &mut sections, &mut verdicts)?;
    }
    if want(2) {
        bench.accuracy(&plan, &mut sections, &mut verdicts)?;
    }
    if want(3) {
        bench.startup(&plan, &mut sections, &mut verdicts)?;
    }
    let mut big = BTreeMap::new();
    if want(4) {
        big = bench.end_of_run(&plan, &mut sections, &mut verdicts)?;
    }
    if want(5) {
        bench.own_cost(&plan, &mut sections)?;
    }
    if want(6) {
        bench.scale(&plan, &big, &mut sections, &mut verdicts)?;
    }
    // Issues 11 and 12: CFI unwinding and Python frames (xtask/src/bench/unwind.rs). A section
    // that fails says so in the report instead of losing the whole run's figures.
    type Section = fn(&Bench, &Plan, &mut String, &mut Vec<Verdict>) -> Result<()>;
    let unwind_sections: [(u32, Section); 5] = [
        (7, Bench::kernel_unwind),
        (8, Bench::table_build),
        (9, Bench::unwind_startup),
        (10, Bench::dwarf_overhead),
        (11, Bench::python),
    ];
    for (n, section) in unwind_sections {
        if want(n) {
            if let Err(e) = section(&bench, &plan, &mut sections, &mut verdicts) {
                println!("    section {n} failed: {e:#}");
                writeln!(sections, "\n## {n}. (failed in this run: {e:#})\n")?;
            }
        }
    }
    let mut md = md.replace(
        "LOAD_AT_END",
        &format!("when it ended: {}.", unwind::load_average()),
    );

    writeln!(md, "## Targets\n")?;
    writeln!(md, "| target | measured | met |\n|---|---|---|")?;
    for v in &verdicts {
        writeln!(
            md,
            "| {} | {} | {} |",
            v.target,
            v.measured,
            if v.met { "yes" } else { "**no**" }
        )?;
    }
    let losses = bench.bpfprof_losses.borrow();
    writeln!(
        md,
        "\nSamples bpfprof dropped over every run of this bench, by reason: {}.\n",
        if losses.values().all(|&n| n == 0) {
            "none".to_string()
        } else {
            losses
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    )?;
    md.push_str(&sections);
    writeln!(md, "\n## Where bpfprof loses, and why\n")?;
    why(
        &mut md,
        &bench.findings.borrow(),
        &losses,
        &bench.walker_verify_ms,
    )?;

    let (md_path, svg) = if only.is_some() {
        (
            bench.dir.join("BENCHMARKS.partial.md"),
            bench.dir.join("overhead.partial.svg"),
        )
    } else {
        (
            bench.root.join("BENCHMARKS.md"),
            bench.root.join("bench/overhead.svg"),
        )
    };
    if !overhead.ratios.is_empty() {
        plot(&svg, &plan.overhead_hz, &overhead.ratios)?;
    }
    fs::write(&md_path, &md)?;
    println!("\n{md}");
    println!(
        "==> wrote {} and {} in {}",
        md_path.display(),
        svg.display(),
        crate::cmd::secs(started.elapsed())
    );
    Ok(())
}

/// The kernel's verification time of the CFI/Python walker program, in ms, for each of
/// `rounds` loads, as `bpfprof doctor --json` reports it (`walker_load`).
fn walker_verify_ms(bpfprof: &Path, rounds: usize) -> Result<Vec<f64>> {
    (0..rounds)
        .map(|_| {
            let out = Command::new(bpfprof)
                .args(["doctor", "--json"])
                .output()
                .context("running bpfprof doctor")?;
            let report: Value =
                serde_json::from_slice(&out.stdout).context("reading bpfprof doctor --json")?;
            let found = report["checks"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["name"] == "walker_load")
                .and_then(|c| c["found"].as_str())
                .context("bpfprof doctor has no walker_load check")?;
            found
                .strip_prefix("the CFI and Python walker verified in ")
                .and_then(|rest| rest.strip_suffix(" ms"))
                .and_then(|ms| ms.parse::<f64>().ok())
                .with_context(|| format!("the walker did not verify: {found}"))
        })
        .collect()
}

/// Installs the profilers and the compiler if missing, with xtask's apt helpers.
fn install_tools() -> Result<()> {
    println!("==> apt packages: {}", TOOLS.join(" "));
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|p| !crate::cmd::apt_installed(p))
        .collect();
    if missing.is_empty() {
        println!("    all already installed");
        return Ok(());
    }
    crate::cmd::run(
        crate::cmd::as_root("apt-get")?
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    crate::cmd::run(
        crate::cmd::as_root("apt-get")?
            .args(["install", "-y"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// One line of the targets table.
struct Verdict {
    target: String,
    measured: String,
    met: bool,
}

// -------------------------------------------------------------------------------------------
// Sections
// -------------------------------------------------------------------------------------------

impl Bench {
    /// Section 1: the workload's slowdown under each profiler, as a ratio to running alone.
    fn overhead(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<Overhead> {
        println!("==> 1. overhead");
        let argv = self.workload("burn", &[BURN_ITERS, &self.cpus.to_string()]);
        self.launch(None, 0, &argv, false)?; // warm-up: page cache, CPU frequency
        let rounds = plan.overhead_rounds();
        let mut result = Overhead::default();
        // An idle process for the floor run to watch.
        let mut idle = Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::null())
            .spawn()
            .context("starting sleep")?;
        let run = (|| -> Result<()> {
            for &hz in &plan.overhead_hz {
                for round in 0..rounds {
                    // Alone, the floor and every profiler in a rotated order; each ratio is
                    // to the same round's run alone.
                    let mut order = vec![
                        Arm::Alone,
                        Arm::Floor,
                        Arm::PerfSystemWide,
                        Arm::Under(Tool::BpfprofFixed),
                    ];
                    order.extend(TOOLS_COMPARED.map(Arm::Under));
                    rotate(&mut order, round);
                    let mut times = BTreeMap::new();
                    for arm in order {
                        let secs = match arm {
                            Arm::Alone => self.launch(None, hz, &argv, false)?.value("secs")?,
                            Arm::Under(tool) => {
                                self.launch(Some(tool), hz, &argv, false)?.value("secs")?
                            }
                            Arm::Floor => {
                                let watching = self.attach_start(
                                    Tool::Bpfprof,
                                    hz,
                                    idle.id() as i32,
                                    AttachOpts::default(),
                                )?;
                                // Well past bpfprof's start-up (section 3), so that the timers
                                // run for all of the workload.
                                std::thread::sleep(Duration::from_millis(500));
                                let secs = self.launch(None, hz, &argv, false)?.value("secs");
                                self.stop(watching)?;
                                secs?
                            }
                            Arm::PerfSystemWide => {
                                let mut perf = Command::new("perf")
                                    .args(["record", "-q", "-a", "-g", "-e", "cpu-clock", "-F"])
                                    .arg(hz.to_string())
                                    .arg("-o")
                                    .arg(self.dir.join("system-wide.perf"))
                                    .stdin(Stdio::null())
                                    .stdout(Stdio::null())
                                    .stderr(Stdio::null())
                                    .spawn()
                                    .context("starting perf record -a")?;
                                // perf's start-up is under 250 ms (section 3).
                                std::thread::sleep(Duration::from_millis(500));
                                let secs = self.launch(None, hz, &argv, false);
                                signal(&perf, libc::SIGINT);
                                let _ = perf.wait();
                                secs?.value("secs")?
                            }
                        };
                        println!("    {hz} Hz round {round}: {} {secs:.3}s", arm.name());
                        times.insert(arm, secs);
                    }
                    let alone = times[&Arm::Alone];
                    result.alone.entry(hz).or_default().push(alone);
                    for (arm, secs) in times {
                        if arm != Arm::Alone {
                            result
                                .ratios
                                .entry((arm, hz))
                                .or_default()
                                .push(secs / alone);
                        }
                    }
                }
            }
            Ok(())
        })();
        stop_target(&mut idle);
        run?;

        let ratios = &result.ratios;
        writeln!(md, "\n## 1. Overhead on the target\n")?;
        writeln!(md, "A fixed amount of CPU-bound work (`bench/burn.c`: {BURN_ITERS} multiply-adds per thread, one thread per core, a dozen frames deep) timed by the workload itself, alone and with each profiler attached before it starts (launch mode: `bpfprof -- CMD`, `perf record -- CMD`, `bpftrace -c CMD`). Slowdown = time under the profiler / time alone in the same round; median (min–max) over {rounds} rounds, the runs of a round in a rotated order.\n")?;
        writeln!(md, "The *timer floor* row is bpfprof sampling an idle process (`--pid` of a `sleep`) while the workload runs alone: the sampling timers fire on every CPU and the kernel program runs and rejects every sample, but no stack is walked and nothing is recorded. It is the cost of `cpu-clock` sampling itself, which all three profilers pay. The `bpfprof --fixed-interval` row is bpfprof without its randomized periods (each redraw is one `PERF_EVENT_IOC_PERIOD` per CPU, which restarts that CPU's timer): the difference to the bpfprof row is what protection against aliasing costs. The `perf record -a -g` row is perf with one event per CPU for the whole system, as bpfprof and bpftrace sample, started before the workload and stopped after it; `perf record -- CMD` opens per-task events instead, whose timers run only while the command's threads run.\n")?;
        writeln!(
            md,
            "| | {} |",
            join(plan.overhead_hz.iter().map(|hz| format!("{hz} Hz")), " | ")
        )?;
        writeln!(md, "|---|{}", "---|".repeat(plan.overhead_hz.len()))?;
        writeln!(
            md,
            "| alone, seconds | {} |",
            join(
                plan.overhead_hz.iter().map(|hz| stat(&result.alone[hz], 3)),
                " | "
            )
        )?;
        for arm in [
            Arm::Floor,
            Arm::PerfSystemWide,
            Arm::Under(Tool::BpfprofFixed),
        ]
        .into_iter()
        .chain(TOOLS_COMPARED.map(Arm::Under))
        {
            writeln!(
                md,
                "| {} | {} |",
                arm.name(),
                join(
                    plan.overhead_hz
                        .iter()
                        .map(|hz| stat(&ratios[&(arm, *hz)], 3)),
                    " | "
                )
            )?;
        }
        // The target compares what each profiler adds: the slowdown's excess over 1.
        let mut cells = Vec::new();
        for &hz in &plan.overhead_hz {
            let excess = |tool| median(&ratios[&(Arm::Under(tool), hz)]) - 1.0;
            let (b, p) = (excess(Tool::Bpfprof), excess(Tool::Perf));
            let (cell, met) = if p <= 0.0 {
                (
                    format!(
                        "perf {:+.1}%, bpfprof {:+.1}% (perf within noise)",
                        p * 100.0,
                        b * 100.0
                    ),
                    b <= 0.0,
                )
            } else {
                (
                    format!(
                        "{:.2} (bpfprof {:+.1}%, perf {:+.1}%)",
                        b / p,
                        b * 100.0,
                        p * 100.0
                    ),
                    b <= 0.5 * p,
                )
            };
            cells.push(cell.clone());
            verdicts.push(Verdict {
                target: format!("overhead at most half of perf's, {hz} Hz"),
                measured: format!("bpfprof's added time / perf's: {cell}"),
                met,
            });
        }
        writeln!(
            md,
            "| bpfprof's added time / perf's (target ≤ 0.5) | {} |",
            join(cells, " | ")
        )?;
        self.deep_stacks(plan, md)?;
        self.findings.borrow_mut().overhead = plan
            .overhead_hz
            .iter()
            .map(|&hz| {
                let excess = |arm| median(&ratios[&(arm, hz)]) - 1.0;
                (
                    hz,
                    excess(Arm::Floor),
                    excess(Arm::Under(Tool::Bpfprof)),
                    excess(Arm::Under(Tool::Perf)),
                    excess(Arm::PerfSystemWide),
                )
            })
            .collect();
        self.findings.borrow_mut().overhead_fixed = plan
            .overhead_hz
            .iter()
            .map(|&hz| {
                let excess = |arm| median(&ratios[&(arm, hz)]) - 1.0;
                (hz, excess(Arm::Under(Tool::BpfprofFixed)))
            })
            .collect();
        writeln!(md, "\n![overhead vs frequency](bench/overhead.svg)")?;
        Ok(result)
    }

    /// Section 1, continued: the same work with stacks near the kernel's 127-frame limit, where
    /// stack walking and copying weigh most against the interrupt itself.
    fn deep_stacks(&self, plan: &Plan, md: &mut String) -> Result<()> {
        let hz = *plan
            .overhead_hz
            .iter()
            .max()
            .context("no overhead frequency")?;
        let argv = self.workload(
            "burn",
            &[BURN_ITERS, &self.cpus.to_string(), &DEEP_DEPTH.to_string()],
        );
        let mut ratios: BTreeMap<Option<Tool>, Vec<f64>> = BTreeMap::new();
        let mut alone = Vec::new();
        for round in 0..plan.overhead_rounds() {
            let mut order: Vec<Option<Tool>> = vec![None];
            order.extend(TOOLS_COMPARED.map(Some));
            rotate(&mut order, round);
            let mut times = BTreeMap::new();
            for tool in order {
                let secs = self.launch(tool, hz, &argv, false)?.value("secs")?;
                let name = tool.map_or("alone", |t| t.name());
                println!("    deep stacks, {hz} Hz round {round}: {name} {secs:.3}s");
                times.insert(tool, secs);
            }
            let base = times[&None];
            alone.push(base);
            for (tool, secs) in times {
                if tool.is_some() {
                    ratios.entry(tool).or_default().push(secs / base);
                }
            }
        }
        writeln!(md, "\nThe same work {DEEP_DEPTH} frames deeper (stacks of about {} frames, near the kernel's limit of 127, which every profiler here walks and bpfprof hashes and perf copies to its ring buffer) at {hz} Hz; slowdown as above, median (min–max) over {} rounds, alone {} s.\n", DEEP_DEPTH + 4, plan.overhead_rounds(), stat(&alone, 3))?;
        writeln!(
            md,
            "| profiler | slowdown, {DEEP_DEPTH}-deep stacks, {hz} Hz |"
        )?;
        writeln!(md, "|---|---|")?;
        for tool in TOOLS_COMPARED {
            writeln!(
                md,
                "| {} | {} |",
                tool.name(),
                stat(&ratios[&Some(tool)], 3)
            )?;
        }
        Ok(())
    }

    /// Section 2: error against a known split, and on a workload that aliases with fixed
    /// intervals.
    fn accuracy(&self, plan: &Plan, md: &mut String, verdicts: &mut Vec<Verdict>) -> Result<()> {
        println!("==> 2. accuracy");
        let mut errors: BTreeMap<(Tool, u64), Vec<f64>> = BTreeMap::new();
        let mut counts: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        let mut truths = Vec::new();
        for &hz in &plan.accuracy_hz {
            for round in 0..plan.rounds {
                let mut order = TOOLS_COMPARED.to_vec();
                rotate(&mut order, round);
                for tool in order {
                    let run = self.launch(
                        Some(tool),
                        hz,
                        &self.workload("split", &[SPLIT_CHUNKS]),
                        true,
                    )?;
                    let truth = run.value("truth")?;
                    let (share, n) = share_of(&run.stacks, "leaf_hot", "leaf_cold")?;
                    println!(
                        "    {hz} Hz {}: leaf_hot {share:.2}% of {n} (truth {truth:.2}%)",
                        tool.name()
                    );
                    truths.push(truth);
                    errors
                        .entry((tool, hz))
                        .or_default()
                        .push((share - truth).abs());
                    counts.entry(hz).or_default().push(n as f64);
                }
            }
        }
        writeln!(md, "\n## 2. Accuracy\n")?;
        writeln!(md, "`bench/split.c` spends its CPU time in `leaf_hot` and `leaf_cold` (identical loops) in chunks of random length and order, 75:25 in expectation; it measures the true split itself (thread CPU time per chunk): {} % for `leaf_hot` over these runs. Error = |profiler's share for `leaf_hot` − true share|, in percentage points, median (min–max) over {} rounds. A sample counts for the nearest of the two functions on its stack.\n", stat(&truths, 2), plan.rounds)?;
        table(md, &TOOLS_COMPARED, &plan.accuracy_hz, |tool, hz| {
            stat(&errors[&(tool, hz)], 2)
        })?;
        writeln!(
            md,
            "| sampling error alone (1σ, binomial at the median sample count) | {} |",
            join(
                plan.accuracy_hz.iter().map(|hz| {
                    let n = median(&counts[hz]);
                    format!("{:.2} (n = {n:.0})", 100.0 * (0.75 * 0.25 / n).sqrt())
                }),
                " | "
            )
        )?;
        if plan.accuracy_hz.contains(&999) {
            let e = median(&errors[&(Tool::Bpfprof, 999)]);
            verdicts.push(Verdict {
                target: "accuracy within 1 point of the truth at 999 Hz".into(),
                measured: format!("{e:.2} points (median)"),
                met: e <= 1.0,
            });
        }

        // The aliasing workload.
        let mut alias_tools = vec![Tool::Bpfprof];
        if self.has_fixed {
            alias_tools.push(Tool::BpfprofFixed);
        }
        alias_tools.extend([Tool::Perf, Tool::Bpftrace]);
        let mut shares: BTreeMap<(Tool, u64), Vec<f64>> = BTreeMap::new();
        // Each run's error in binomial standard deviations (at its own sample count).
        let mut worst: BTreeMap<Tool, (f64, f64, u64)> = BTreeMap::new();
        for &hz in &plan.alias_hz {
            for round in 0..plan.rounds {
                let mut order = alias_tools.clone();
                rotate(&mut order, round);
                for tool in order {
                    let run = self.launch(
                        Some(tool),
                        hz,
                        &self.workload("alias", &[ALIAS_PERIODS]),
                        true,
                    )?;
                    let (share, n) = share_of(&run.stacks, "leaf_hot", "leaf_cold")?;
                    println!(
                        "    alias {hz} Hz {}: leaf_hot {share:.1}% of {n}",
                        tool.name()
                    );
                    shares.entry((tool, hz)).or_default().push(share);
                    let z = (share - 75.0).abs() / (100.0 * (0.75 * 0.25 / n as f64).sqrt());
                    let w = worst.entry(tool).or_insert((0.0, share, hz));
                    if z > w.0 {
                        *w = (z, share, hz);
                    }
                }
            }
        }
        writeln!(md, "\n### Aliasing\n")?;
        write!(md, "`bench/alias.c` repeats a 10 ms period, exactly: 7.5 ms busy in `leaf_hot`, then 2.5 ms in `leaf_cold` (TSC deadlines, so the period does not drift). 10 ms is a multiple of the 100 Hz and 1000 Hz sampling periods. Share of samples in `leaf_hot`, in percent (truth: 75), median (min–max) over {} rounds of 3 s; binomial 1σ is about 2.5 points at 100 Hz.", plan.rounds)?;
        if self.has_fixed {
            writeln!(md, " bpfprof redraws each CPU's sampling period around the requested mean (rates uniform within ±50%, redrawn after 2 to 6 mean periods but no more often than every 5 to 15 ms; each redraw restarts the CPU's timer at a moment unrelated to the workload) unless given `--fixed-interval`; perf and bpftrace always sample at a fixed interval.")?;
        }
        writeln!(md)?;
        table(md, &alias_tools, &plan.alias_hz, |tool, hz| {
            stat(&shares[&(tool, hz)], 1)
        })?;
        let describe = |tool: Tool| {
            let (z, share, hz) = worst[&tool];
            format!("{} {share:.1}% at {hz} Hz ({z:.1}σ)", tool.name())
        };
        verdicts.push(Verdict {
            target: "robust to aliasing: every run within 3σ of 75% on the 10 ms workload".into(),
            measured: format!(
                "worst run: {}",
                join(alias_tools.iter().map(|t| describe(*t)), "; ")
            ),
            met: worst[&Tool::Bpfprof].0 <= 3.0,
        });
        let mut f = self.findings.borrow_mut();
        f.alias_worst = Some(worst[&Tool::Bpfprof]);
        f.alias_fixed_worst = worst.get(&Tool::BpfprofFixed).copied();
        f.alias_bpfprof_runs = plan
            .alias_hz
            .iter()
            .map(|hz| (*hz, shares[&(Tool::Bpfprof, *hz)].clone()))
            .collect();
        Ok(())
    }

    /// Section 3: from the command's start to the first sample.
    fn startup(&self, plan: &Plan, md: &mut String, verdicts: &mut Vec<Verdict>) -> Result<()> {
        println!("==> 3. start-up latency");
        let rounds = plan.rounds.max(if plan.quick { 1 } else { 3 });
        let hz = 999;
        let mut first: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut ready: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let launch_rows = [
            (Tool::Bpfprof, "bpfprof -- CMD"),
            (Tool::Perf, "perf record -- CMD"),
            (Tool::Bpftrace, "bpftrace -c CMD"),
        ];
        let attach_rows = [
            (Tool::Bpfprof, "bpfprof --pid PID"),
            (Tool::Perf, "perf record -p PID"),
            (Tool::Bpftrace, "bpftrace, /pid == PID/"),
        ];
        for _ in 0..rounds {
            for (tool, row) in launch_rows {
                let run = self.launch(Some(tool), hz, &self.startup_argv(), true)?;
                let start = run.value("start")? as u64;
                let ms = first_sample_ns(&run.stacks, start)
                    .map(|t| (t as f64 - run.spawned_ns as f64) / 1e6);
                println!("    {row}: first sample after {ms:?} ms");
                first.entry(row).or_default().push(ms.unwrap_or(f64::NAN));
            }
            for (tool, row) in attach_rows {
                let ms = self.attach_startup(tool, hz)?;
                println!("    {row}: first sample after {ms:?} ms");
                first.entry(row).or_default().push(ms.unwrap_or(f64::NAN));
            }
            for (cold, row) in self.daemon_startup(hz)?.into_iter().zip([
                "bpfprof run --async (daemon's first run)",
                "bpfprof run --async (daemon's next run)",
            ]) {
                println!(
                    "    {row}: RUNNING after {:.1} ms, first sample {:?}",
                    cold.0, cold.1
                );
                ready.entry(row).or_default().push(cold.0);
                first
                    .entry(row)
                    .or_default()
                    .push(cold.1.unwrap_or(f64::NAN));
            }
        }
        writeln!(md, "\n## 3. Start-up latency\n")?;
        writeln!(md, "From the moment the bench starts the command to the profiler's first sample of the target, at {hz} Hz; median (min–max) over {rounds} rounds, in ms. `bench/startup.c` prints its start time (CLOCK_MONOTONIC, the clock the bench reads before spawning the command) and then spends millisecond k in function `slot_k`: the first slot in the profile dates the first sample to within a millisecond (taken as the slot's middle). Launch mode starts the workload under the profiler; attach mode starts the profiler against the workload already running. For the daemon, `run` returns once the run is RUNNING; the time to that is shown too (client start-up included). By design, `bpfprof --pid` and a daemon run on a freshly loaded program wait for the kernel to verify the CFI/Python walker program ({} ms here, measured by `bpfprof doctor` at the start of this bench) before their first sample, so that every stack they record is walked whole; a launched command starts at once and counts its first stacks, taken by frame pointers, apart; the daemon keeps its program loaded for 30 s after a run, so its next runs start without the wait.\n", self.walker_verify_ms)?;
        writeln!(
            md,
            "| command | to first sample, ms | to RUNNING, ms |\n|---|---|---|"
        )?;
        for (_, row) in launch_rows.iter().chain(attach_rows.iter()) {
            writeln!(md, "| {row} | {} | |", stat(&first[row], 1))?;
        }
        for (row, v) in &ready {
            writeln!(md, "| {row} | {} | {} |", stat(&first[row], 1), stat(v, 1))?;
        }
        let cli = median(&first["bpfprof -- CMD"]);
        self.findings.borrow_mut().startup_ms = Some(cli);
        verdicts.push(Verdict {
            target: "start-up to first sample under 100 ms (bpfprof -- CMD)".into(),
            measured: format!("{cli:.1} ms (median)"),
            met: cli < 100.0,
        });
        let attach = median(&first["bpfprof --pid PID"]);
        verdicts.push(Verdict {
            target: "start-up to first sample under 100 ms (bpfprof --pid)".into(),
            measured: format!("{attach:.1} ms (median)"),
            met: attach < 100.0,
        });
        for (row, v) in &ready {
            let f = median(&first[row]);
            verdicts.push(Verdict {
                target: format!("start-up under 100 ms ({row})"),
                measured: format!(
                    "RUNNING after {:.1} ms, first sample after {f:.1} ms (medians)",
                    median(v)
                ),
                met: f < 100.0,
            });
        }
        Ok(())
    }

    /// Section 4: from stop to the written profile, on a large binary with many unique
    /// stacks.
    fn end_of_run(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<BTreeMap<Tool, Vec<Attached>>> {
        println!("==> 4. end-of-run cost");
        let hz = 4999;
        let mut runs: BTreeMap<Tool, Vec<Attached>> = BTreeMap::new();
        let mut target = self.spawn_target("big", &[&self.cpus.to_string(), "0"])?;
        let pid = target.id() as i32;
        let opts = AttachOpts {
            count_fired: true,
            ..Default::default()
        };
        let result = (|| -> Result<()> {
            for round in 0..plan.rounds {
                let mut order = TOOLS_COMPARED.to_vec();
                rotate(&mut order, round);
                for tool in order {
                    let run = self.attach_for(tool, hz, pid, opts)?;
                    println!(
                        "    {}: {} samples, {} unique stacks, stop {:.2}s{}",
                        tool.name(),
                        run.stacks.values().sum::<u64>(),
                        run.stacks.len(),
                        run.stop_secs,
                        run.post
                            .map(|p| format!(", perf script + fold {:.2}s", p.secs))
                            .unwrap_or_default()
                    );
                    runs.entry(tool).or_default().push(run);
                }
            }
            Ok(())
        })();
        stop_target(&mut target);
        result?;
        let size = fs::metadata(self.dir.join("big"))?.len();
        writeln!(md, "\n## 4. End-of-run cost\n")?;
        writeln!(md, "A generated C program (`target/bench/big.c`, {} functions in a {}-level call tree, built with `-g`: {:.1} MiB) runs one thread per core, each taking random root-to-leaf paths, so nearly every sample has a stack of its own. Each profiler attaches for {ATTACH_SECS} s at {hz} Hz and is then stopped with SIGINT; the time is from the signal to the profiler's exit with its profile written. perf's profile is `perf.data`: turning it into stacks (`perf script`, folded with inferno) is shown on its own and in the total. Frames = frames of the written folded profile (unique stacks × their depth); frames/s = frames / total. Median (min–max) over {} rounds; peak RSS is the process's whole-life peak (for perf, the larger of `perf record` and `perf script`).\n", BIG_LEVELS * BIG_PER_LEVEL, BIG_LEVELS, size as f64 / 1048576.0, plan.rounds)?;
        writeln!(md, "| profiler | samples kept | drops | unique stacks | stop → written, s | + perf script and fold, s | total, s | peak RSS, MiB | frames/s |\n|---|---|---|---|---|---|---|---|---|")?;
        for tool in TOOLS_COMPARED {
            let r = &runs[&tool];
            let f = |g: &dyn Fn(&Attached) -> f64, d| stat(&r.iter().map(g).collect::<Vec<_>>(), d);
            let total = end_secs;
            let rss = peak_rss_mib;
            let frames = |a: &Attached| frames_of(&a.stacks) as f64;
            writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                tool.name(),
                f(&|a| a.stacks.values().sum::<u64>() as f64, 0),
                f(&|a| a.drops.map_or(f64::NAN, |d| d as f64), 0),
                f(&|a| a.stacks.len() as f64, 0),
                f(&|a| a.stop_secs, 2),
                if tool == Tool::Perf {
                    f(&|a| a.post.map_or(0.0, |p| p.secs), 2)
                } else {
                    "—".into()
                },
                f(&total, 2),
                f(&rss, 1),
                f(&|a| frames(a) / total(a), 0),
            )?;
        }
        writeln!(md, "\nDrops: samples the profiler's probe fired for but did not keep (bpfprof's loss counters; perf's LOST records; bpftrace's `@n` less its map's total, empty stacks counted as drops).")?;
        let b = &runs[&Tool::Bpfprof];
        let drops: Vec<f64> = b.iter().map(|a| a.drops.unwrap_or(0) as f64).collect();
        verdicts.push(Verdict {
            target: format!("no drops at {hz} Hz, many unique stacks (section 4)"),
            measured: format!(
                "{} of {} samples dropped (median)",
                median(&drops),
                median(
                    &b.iter()
                        .map(|a| (a.stacks.values().sum::<u64>() + a.drops.unwrap_or(0)) as f64)
                        .collect::<Vec<_>>()
                )
            ),
            met: median(&drops) == 0.0,
        });
        Ok(runs)
    }

    /// Section 5: the profilers' own CPU and memory, and the per-sample cost of the BPF
    /// programs.
    fn own_cost(&self, plan: &Plan, md: &mut String) -> Result<()> {
        println!("==> 5. own cost");
        let mut runs: BTreeMap<(Tool, u64), Vec<Attached>> = BTreeMap::new();
        let mut target = self.spawn_target("burn", &["0", &self.cpus.to_string()])?;
        let pid = target.id() as i32;
        let mut bpf: BTreeMap<Tool, Vec<f64>> = BTreeMap::new();
        let result = (|| -> Result<()> {
            for &hz in &plan.own_cost_hz {
                for round in 0..plan.rounds {
                    let mut order = TOOLS_COMPARED.to_vec();
                    rotate(&mut order, round);
                    for tool in order {
                        let run = self.attach_for(tool, hz, pid, AttachOpts::default())?;
                        println!(
                            "    {hz} Hz {}: {:.3} CPU s, {:.1} MiB",
                            tool.name(),
                            run.usage.cpu_secs,
                            run.usage.max_rss_kib / 1024.0
                        );
                        runs.entry((tool, hz)).or_default().push(run);
                    }
                }
            }
            // BPF statistics cost a little on every run of every program: separate runs.
            let opts = AttachOpts {
                bpf_stats: true,
                ..Default::default()
            };
            for _ in 0..plan.rounds {
                let b = self.attach_for(Tool::Bpfprof, 999, pid, opts)?;
                if let Some(ns) = b
                    .summary
                    .as_ref()
                    .and_then(|s| s["bpf_ns_per_run"].as_f64())
                {
                    bpf.entry(Tool::Bpfprof).or_default().push(ns);
                }
                let t = self.attach_for(Tool::Bpftrace, 999, pid, opts)?;
                if let Some((ns, n)) = t.bpf_stats.filter(|s| s.1 > 0) {
                    bpf.entry(Tool::Bpftrace)
                        .or_default()
                        .push(ns as f64 / n as f64);
                }
            }
            Ok(())
        })();
        stop_target(&mut target);
        result?;
        writeln!(md, "\n## 5. The profiler's own cost\n")?;
        writeln!(md, "Each profiler attached to `bench/burn.c` (one thread per core, running until killed) for {ATTACH_SECS} s, then stopped with SIGINT. CPU seconds and peak RSS of the profiler's process over its whole life (start-up, sampling, writing the profile; from `wait4`), median (min–max) over {} rounds. For perf, `perf record` alone; `perf script` and folding, which perf needs to give stacks, are shown apart.\n", plan.rounds)?;
        writeln!(md, "| profiler | Hz | CPU s | peak RSS, MiB | perf script + fold: CPU s, peak RSS MiB |\n|---|---|---|---|---|")?;
        for &hz in &plan.own_cost_hz {
            for tool in TOOLS_COMPARED {
                let r = &runs[&(tool, hz)];
                let cpu: Vec<f64> = r.iter().map(|a| a.usage.cpu_secs).collect();
                let rss: Vec<f64> = r.iter().map(|a| a.usage.max_rss_kib / 1024.0).collect();
                let post = if tool == Tool::Perf {
                    let c: Vec<f64> = r
                        .iter()
                        .map(|a| a.post.map_or(0.0, |p| p.usage.cpu_secs))
                        .collect();
                    let m: Vec<f64> = r
                        .iter()
                        .map(|a| a.post.map_or(0.0, |p| p.usage.max_rss_kib / 1024.0))
                        .collect();
                    format!("{}, {}", stat(&c, 2), stat(&m, 1))
                } else {
                    "—".into()
                };
                writeln!(
                    md,
                    "| {} | {hz} | {} | {} | {post} |",
                    tool.name(),
                    stat(&cpu, 2),
                    stat(&rss, 1)
                )?;
            }
        }
        writeln!(md, "\nKernel-side cost per sample: run time of the profiler's BPF program per invocation, from `kernel.bpf_stats_enabled` (bpfprof `--bpf-stats`; for bpftrace, statistics turned on around its run and read from the fdinfo of its program), at 999 Hz on the same target, median (min–max) over {} rounds. Both programs run on every sample of every CPU and walk the user and kernel stacks of the target's samples; perf's in-kernel work (no BPF) cannot be read this way.\n", plan.rounds)?;
        writeln!(md, "| profiler | ns per sample |\n|---|---|")?;
        for tool in [Tool::Bpfprof, Tool::Bpftrace] {
            writeln!(
                md,
                "| {} | {} |",
                tool.name(),
                bpf.get(&tool).map_or("not measured".into(), |v| stat(v, 0))
            )?;
        }
        let mut f = self.findings.borrow_mut();
        f.bpf_ns = bpf.clone();
        let hz = plan.own_cost_hz[0];
        f.peak_rss_mib = TOOLS_COMPARED
            .iter()
            .map(|t| {
                let v: Vec<f64> = runs[&(*t, hz)]
                    .iter()
                    .map(|a| a.usage.max_rss_kib / 1024.0)
                    .collect();
                (*t, median(&v))
            })
            .collect();
        let last: Vec<f64> = runs[&(Tool::Bpfprof, hz)]
            .iter()
            .map(|a| a.usage.last_rss_kib / 1024.0)
            .collect();
        f.bpfprof_last_rss_mib = Some(median(&last));
        Ok(())
    }

    /// Section 6: samples per second without drops as the frequency rises, and memory as the
    /// number of unique stacks grows.
    fn scale(
        &self,
        plan: &Plan,
        big: &BTreeMap<Tool, Vec<Attached>>,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 6. scale");
        writeln!(md, "\n## 6. Scale\n")?;
        let mut target = self.spawn_target("burn", &["0", &self.cpus.to_string()])?;
        let pid = target.id() as i32;
        let mut rate_rows = Vec::new();
        let result = (|| -> Result<()> {
            for &hz in &plan.rate_hz {
                for tool in TOOLS_COMPARED {
                    let opts = AttachOpts {
                        count_fired: true,
                        bpftrace_exit_after: Some(ATTACH_SECS as u64),
                        ..Default::default()
                    };
                    let run = self.attach_for(tool, hz, pid, opts)?;
                    let kept: u64 = run.stacks.values().sum();
                    let secs = match tool {
                        Tool::Bpfprof | Tool::BpfprofFixed => run
                            .summary
                            .as_ref()
                            .and_then(|s| s["duration_secs"].as_f64()),
                        Tool::Perf => run.span_secs,
                        Tool::Bpftrace => Some(ATTACH_SECS),
                    };
                    // Per CPU-second of the target: the machine may be shared, and the profiler
                    // itself takes CPU from the target.
                    let busy = run.target_cpus.unwrap_or(self.cpus as f64);
                    let rate = secs.map(|s| kept as f64 / s / busy);
                    println!(
                        "    {hz} Hz {}: {kept} samples, {rate:?}/s/CPU, drops {:?}",
                        tool.name(),
                        run.drops
                    );
                    rate_rows.push((hz, tool, kept, rate, run.drops, run.usage, busy));
                }
            }
            Ok(())
        })();
        stop_target(&mut target);
        result?;
        writeln!(md, "Each profiler attached for {ATTACH_SECS} s to `bench/burn.c` (one thread per core, so every CPU is busy with the target) at rising frequencies, one round each. Samples kept per second of target CPU time (the target's CPU time from `/proc/PID/stat` over the run; as a share of the requested rate) and drops: bpfprof's own loss counters (stack and sample maps; `[truncated]` stacks are kept and not counted), perf's LOST records (`perf report --stats`), and for bpftrace the samples its probe fired for (an extra `@n = count()`) less those in its printed map. Time base: bpfprof's summary, perf's first-to-last sample, bpftrace's own `interval:s:{}` exit.\n", ATTACH_SECS as u64)?;
        writeln!(md, "| Hz | profiler | target CPUs busy | samples kept | per target CPU-second | drops | profiler CPU s | peak RSS, MiB |\n|---|---|---|---|---|---|---|---|")?;
        for (hz, tool, kept, rate, drops, usage, busy) in &rate_rows {
            writeln!(
                md,
                "| {hz} | {} | {busy:.2} | {kept} | {} | {} | {:.2} | {:.1} |",
                tool.name(),
                rate.map_or("—".into(), |r| format!(
                    "{r:.0} ({:.0}%)",
                    100.0 * r / *hz as f64
                )),
                drops.map_or("not counted".into(), |d| d.to_string()),
                usage.cpu_secs,
                usage.max_rss_kib / 1024.0
            )?;
            if *tool == Tool::Bpfprof {
                self.findings
                    .borrow_mut()
                    .rate_drops
                    .push((*hz, drops.unwrap_or(0)));
            }
            if *tool == Tool::Bpfprof && *hz == 4999 {
                verdicts.push(Verdict {
                    target: "no drops at 4999 Hz on this machine (one busy thread per core)".into(),
                    measured: format!("{} dropped of {kept} kept", drops.unwrap_or(0)),
                    met: drops.unwrap_or(0) == 0,
                });
            }
        }

        // Memory as unique stacks grow: the large binary limited to K distinct paths.
        let hz = 4999;
        let mut ladder: Vec<(String, Tool, Attached)> = Vec::new();
        for &k in &plan.path_limits {
            let mut target = self.spawn_target("big", &[&self.cpus.to_string(), &k.to_string()])?;
            let pid = target.id() as i32;
            let result = (|| -> Result<()> {
                for tool in TOOLS_COMPARED {
                    let opts = AttachOpts {
                        count_fired: true,
                        ..Default::default()
                    };
                    let a = self.attach_for(tool, hz, pid, opts)?;
                    println!(
                        "    {k} paths {}: {} unique stacks, {:.1} MiB",
                        tool.name(),
                        a.stacks.len(),
                        peak_rss_mib(&a)
                    );
                    ladder.push((k.to_string(), tool, a));
                }
                Ok(())
            })();
            stop_target(&mut target);
            result?;
        }
        let mut rows: Vec<(&str, Tool, &Attached)> =
            ladder.iter().map(|(k, t, a)| (k.as_str(), *t, a)).collect();
        for tool in TOOLS_COMPARED {
            // The unlimited case is section 4's runs: their median by unique stacks.
            let Some(runs) = big.get(&tool) else {
                continue;
            };
            let mut r: Vec<&Attached> = runs.iter().collect();
            r.sort_by_key(|a| a.stacks.len());
            rows.push(("unlimited (section 4)", tool, r[r.len() / 2]));
        }
        writeln!(md, "\nMemory as the number of unique stacks grows: the generated binary of section 4 restricted to K distinct call paths, each profiler attached for {ATTACH_SECS} s at {hz} Hz, one round each (the unlimited row is section 4's median run). Peak RSS of the profiler (for perf, the larger of `perf record` and `perf script`); end time from SIGINT to the profile written (for perf, with `perf script` and folding).\n")?;
        writeln!(md, "| paths | profiler | unique stacks | samples kept | drops | peak RSS, MiB | end, s |\n|---|---|---|---|---|---|---|")?;
        self.findings.borrow_mut().stacks = rows
            .iter()
            .filter(|(_, t, _)| *t == Tool::Bpfprof)
            .map(|(k, _, a)| {
                (
                    k.to_string(),
                    a.stacks.len() as u64,
                    a.stacks.values().sum::<u64>(),
                    a.drops.unwrap_or(0),
                )
            })
            .collect();
        for (k, tool, a) in rows {
            writeln!(
                md,
                "| {k} | {} | {} | {} | {} | {:.1} | {:.2} |",
                tool.name(),
                a.stacks.len(),
                a.stacks.values().sum::<u64>(),
                a.drops.map_or("not counted".into(), |d| d.to_string()),
                peak_rss_mib(a),
                end_secs(a),
            )?;
        }
        Ok(())
    }
}

/// What the sections found that the closing section explains.
#[derive(Default)]
struct Findings {
    /// Section 1, by frequency: the median excess slowdown of the timer floor, bpfprof, perf
    /// and `perf record -a`.
    overhead: Vec<(u64, f64, f64, f64, f64)>,
    /// Section 1, by frequency: the median excess slowdown of bpfprof --fixed-interval.
    overhead_fixed: Vec<(u64, f64)>,
    /// Section 2: bpfprof's worst aliasing run (σ, share, Hz), the same for --fixed-interval,
    /// and bpfprof's shares by frequency.
    alias_worst: Option<(f64, f64, u64)>,
    alias_fixed_worst: Option<(f64, f64, u64)>,
    alias_bpfprof_runs: Vec<(u64, Vec<f64>)>,
    /// Section 3: bpfprof CLI to first sample, ms.
    startup_ms: Option<f64>,
    /// Section 5: BPF program ns per sample (every round), and peak RSS in MiB, by profiler;
    /// bpfprof's RSS at the end of its run.
    bpf_ns: BTreeMap<Tool, Vec<f64>>,
    peak_rss_mib: BTreeMap<Tool, f64>,
    bpfprof_last_rss_mib: Option<f64>,
    /// Section 6: bpfprof's (paths, unique stacks, samples kept, drops) on the large binary,
    /// and its drops by frequency on the rate ladder.
    stacks: Vec<(String, u64, u64, u64)>,
    rate_drops: Vec<(u64, u64)>,
}

/// The closing section: each place bpfprof loses, with the numbers from this run and the
/// reason found when the bench was written (on a 2-vCPU Firecracker VM without a PMU).
fn why(
    md: &mut String,
    f: &Findings,
    losses: &BTreeMap<String, u64>,
    walker_verify_ms: &str,
) -> Result<()> {
    let overhead_lost = f
        .overhead
        .iter()
        .any(|(_, _, b, p, _)| *p <= 0.0 && *b > 0.0 || *p > 0.0 && *b > 0.5 * p);
    if !f.overhead.is_empty() && !overhead_lost {
        writeln!(
            md,
            "**Overhead**: at most half of perf's at every frequency in this run.\n"
        )?;
    }
    if overhead_lost {
        let cells = join(
            f.overhead.iter().map(|(hz, floor, b, p, _)| {
                format!(
                    "{hz} Hz: floor {:+.1}%, bpfprof {:+.1}%, perf {:+.1}%",
                    floor * 100.0,
                    b * 100.0,
                    p * 100.0
                )
            }),
            "; ",
        );
        let per_sample = f
            .overhead
            .iter()
            .max_by_key(|o| o.0)
            .map(|(hz, floor, _, _, _)| floor / *hz as f64 * 1e6)
            .unwrap_or(f64::NAN);
        let bpf_us = f
            .bpf_ns
            .get(&Tool::Bpfprof)
            .map_or(f64::NAN, |ns| median(ns) / 1000.0);
        // Frequencies where perf came out clearly cheaper than the per-CPU timer floor.
        let per_task = join(
            f.overhead
                .iter()
                .filter(|(_, floor, _, p, _)| floor - p > 0.01)
                .map(|(hz, floor, _, p, pa)| {
                    format!(
                        "{hz} Hz (perf {:+.1}%, floor {:+.1}%, `perf record -a` {:+.1}%)",
                        p * 100.0,
                        floor * 100.0,
                        pa * 100.0
                    )
                }),
            ", ",
        );
        let per_task = if per_task.is_empty() {
            String::new()
        } else {
            format!(" Where perf did come out cheaper than the floor, at {per_task}, the likely difference is the kind of event: `perf record -- CMD` opens per-task events, whose timers run only while the target's threads run, while bpfprof, like bpftrace, opens one system-wide event per CPU so that one kernel program serves any set of targets (compare `perf record -a`, per-CPU as well, in the same rounds); the gap is a few points, of the order of the rounds' spread.")
        };
        let randomizing = join(
            f.overhead
                .iter()
                .zip(&f.overhead_fixed)
                .map(|((hz, _, b, _, _), (_, fixed))| {
                    format!("{hz} Hz: {:+.1} points", (b - fixed) * 100.0)
                }),
            ", ",
        );
        let randomizing = format!(" Randomized periods against `--fixed-interval` (bpfprof's slowdown less that of bpfprof with fixed periods, medians): {randomizing}; each redraw restarts one CPU's timer through an ioctl and an inter-processor interrupt, also trapped by the hypervisor here.");
        // bpfprof above its own floor, by rate: a cost per sample grows with the rate, a cost
        // per run (bpfprof's start-up work on the workload's CPUs) does not.
        let above_floor: Vec<(u64, f64)> = f
            .overhead
            .iter()
            .map(|(hz, floor, b, _, _)| (*hz, b - floor))
            .collect();
        let least_above = above_floor
            .iter()
            .map(|(_, e)| *e)
            .fold(f64::INFINITY, f64::min);
        let cause = if least_above > 0.02 {
            format!("bpfprof costs more than its timer floor at every rate ({}), about as much at the lowest rate as at the highest: a cost per run, not per sample. It is bpfprof's own start-up work on the workload's CPUs while the short workload keeps every core busy: the kernel verifying the CFI/Python walker program ({} ms of CPU, once per bpfprof process; section 10 gives bpfprof's whole CPU next to the work's) and building unwind tables (symbolization comes after the workload's own timing ends). The floor's bpfprof attached before the workload started and did that work outside the timing. On a longer run the cost is the same and its share smaller, and the daemon pays the verification once for a series of runs. The floor itself is", join(above_floor.iter().map(|(hz, e)| format!("{hz} Hz: {:+.1} points", e * 100.0)), ", "), walker_verify_ms)
        } else {
            "bpfprof costs what its timer floor costs: the sampling timers alone, with the kernel program rejecting every sample and no stack walked, slow the workload about as much as bpfprof recording it does, and about as much as perf does. The floor is".to_string()
        };
        let lowest_in_noise = f
            .overhead
            .iter()
            .min_by_key(|o| o.0)
            .filter(|(_, floor, b, p, _)| [floor, b, p].iter().all(|x| x.abs() < 0.02))
            .map_or(String::new(), |(hz, ..)| {
                format!(
                    " At {hz} Hz all three are within noise of running alone, and so is the ratio."
                )
            });
        writeln!(md, "**Overhead: not half of perf's.** Medians of this run: {cells}.{randomizing} {cause} the sampling timers' cost. At the highest frequency the floor works out to about {per_sample:.0} µs of the workload's time per sample, of which bpfprof's kernel program is {bpf_us:.1} µs (section 5): the rest is the `cpu-clock` interrupt itself, which all three profilers take at the same rate. This machine is a virtual machine without a PMU (a Firecracker guest), where timer interrupts and timer re-arms are trapped by the hypervisor; that, not what a profiler does with a sample, is the cost.{per_task} Halving perf's overhead would take fewer interrupts (a lower rate) or cheaper ones (a PMU on bare metal, where an interrupt costs a few µs and the per-sample work weighs more), not a cheaper kernel program.{lowest_in_noise}\n")?;
    }
    if let Some((z, share, hz)) = f.alias_worst {
        let runs = join(
            f.alias_bpfprof_runs.iter().map(|(hz, v)| {
                format!(
                    "{hz} Hz: {}",
                    join(v.iter().map(|s| format!("{s:.1}")), ", ")
                )
            }),
            "; ",
        );
        let fixed = f.alias_fixed_worst.map_or(String::new(), |(z, s, hz)| {
            format!(" (with `--fixed-interval`: {s:.1}% at {hz} Hz, {z:.1}σ)")
        });
        if z > 3.0 {
            writeln!(md, "**Aliasing: randomized, but a run strayed.** bpfprof's shares for `leaf_hot` (truth 75%) in this run: {runs}. Its worst run, {share:.1}% at {hz} Hz, is {z:.1}σ from the truth{fixed}. Each CPU's period is redrawn after 2 to 6 mean periods (5 to 15 ms at the least), and each redraw restarts the timer at a moment unrelated to the workload, so at most a few consecutive samples share a phase of the loop; a run this far out means a longer stretch stayed in phase, which this bench cannot tell apart from the scheduler delaying the redraw thread.\n")?;
        } else {
            writeln!(md, "**Aliasing: none left.** bpfprof's shares for `leaf_hot` (truth 75%) in this run: {runs}; its worst run is {z:.1}σ from the truth (binomial σ at that run's sample count){fixed}. Each CPU's period is redrawn after 2 to 6 mean periods (5 to 15 ms at the least), and each redraw restarts the timer at a moment unrelated to the workload, so no phase of the loop is sampled for more than a few samples in a row.\n")?;
        }
    }
    if f.stacks.iter().any(|(_, _, _, drops)| *drops > 0) {
        let rows = join(
            f.stacks.iter().map(|(k, uniq, kept, drops)| {
                format!(
                    "{}: {uniq} unique stacks, {drops} of {} samples dropped ({:.0}%)",
                    if k.starts_with("unlimited") {
                        "unlimited paths (section 4)".to_string()
                    } else {
                        format!("{k} paths")
                    },
                    kept + drops,
                    100.0 * *drops as f64 / (kept + drops).max(1) as f64
                )
            }),
            "; ",
        );
        let reasons = join(
            losses
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(k, n)| format!("`{k}` {n}")),
            ", ",
        );
        let ladder = match f.rate_drops.iter().filter(|(_, d)| *d > 0).min_by_key(|(hz, _)| *hz) {
            None => f.rate_drops.iter().map(|(hz, _)| *hz).max().map_or(String::new(), |hz| {
                format!(" With the few stacks of a typical program (section 6's rate ladder) bpfprof dropped nothing up to {hz} Hz.")
            }),
            Some((hz, d)) => format!(" Even with the few stacks of section 6's rate ladder bpfprof dropped {d} samples at {hz} Hz."),
        };
        writeln!(md, "**Drops with many unique stacks.** On the generated binary at 4999 Hz: {rows}. Over the whole bench bpfprof counted {reasons}. The kernel program stores each stack in a preallocated BPF hash map under a 64-bit hash of its frames (16384 entries of 1 KiB), and bpfprof moves the stacks to userspace every half second, or at every tick (100–200 ms) while over a thousand new stacks arrive per move, so the map fills only if 16384 new stacks arrive within one tick; sample-map-full means more than 65536 distinct (thread, user stack, kernel stack) keys in one run. perf copies every stack into its ring buffer; bpftrace keeps stacks in a stack trace map, which refuses a stack whose bucket is taken, plus a 4096-key limit on its map.{ladder}\n")?;
    }
    if let (Some(b), Some(p)) = (
        f.peak_rss_mib.get(&Tool::Bpfprof),
        f.peak_rss_mib.get(&Tool::Perf),
    ) {
        if b > p {
            let last = f.bpfprof_last_rss_mib.map_or(String::new(), |m| {
                format!(" (in this run {m:.1} MiB just before exit)")
            });
            let startup = f.startup_ms.map_or(String::new(), |ms| {
                format!(" ({ms:.0} ms to the first sample in section 3)")
            });
            let bpftrace = f
                .peak_rss_mib
                .get(&Tool::Bpftrace)
                .copied()
                .unwrap_or(f64::NAN);
            writeln!(md, "**Peak memory: more than `perf record`** ({b:.1} MiB against {p:.1} MiB in section 5; bpftrace {bpftrace:.1} MiB). bpfprof's peak is a start-up transient: aya's loader (0.14) parses the kernel's BTF (`/sys/kernel/btf/vmlinux`) whenever it is created, which heaptrack showed as about 9 MiB of heap at the peak, although bpfprof's program needs no BTF relocation; while it samples, bpfprof's resident size is about 9 MiB (`/proc/PID/smaps_rollup` during a run when this bench was written), and it grows again at the end, when stacks are symbolized{last}. With many distinct stacks the end is the peak instead (section 4: blazesym's view of a 13 MiB binary's DWARF plus every stack held for aggregation). The same parse is part of bpfprof's start-up{startup}; an aya release that lets a loader skip it would cut both.\n")?;
        }
    }
    if let (Some(b), Some(t)) = (f.bpf_ns.get(&Tool::Bpfprof), f.bpf_ns.get(&Tool::Bpftrace)) {
        if median(b) > median(t) {
            let (sb, st) = (sorted(b), sorted(t));
            let overlap = sb.first() <= st.last() && st.first() <= sb.last();
            writeln!(md, "**Kernel program per sample: no cheaper than bpftrace's** ({} ns against {} ns{}). Both walk the user and kernel stacks of a target's sample (frame pointers, then the kernel's unwinder) and update a hash map; bpfprof copies each stack with `bpf_get_stack` and hashes its frames itself (bpftrace's `bpf_get_stackid` hashes them in the kernel), and first looks up the sample's pid namespace so that it can tell targets apart across containers. The stack walks dominate.\n", stat(b, 0), stat(t, 0), if overlap { "; the spreads overlap" } else { "" })?;
        }
    }
    Ok(())
}

/// Peak RSS of a profiler in MiB; for perf, the larger of `perf record` and `perf script`.
fn peak_rss_mib(a: &Attached) -> f64 {
    a.usage
        .max_rss_kib
        .max(a.post.map_or(0.0, |p| p.usage.max_rss_kib))
        / 1024.0
}

/// From the stop signal to stacks: the profiler's exit, plus perf's `perf script` and folding.
fn end_secs(a: &Attached) -> f64 {
    a.stop_secs + a.post.map_or(0.0, |p| p.secs)
}

// -------------------------------------------------------------------------------------------
// Running profilers
// -------------------------------------------------------------------------------------------

impl Bench {
    fn compile_workloads(&self) -> Result<()> {
        println!("==> compiling the workloads into {}", self.dir.display());
        let src = self.root.join("bench");
        for name in ["burn", "split", "alias", "startup"] {
            self.cc(&src.join(format!("{name}.c")), name, CFLAGS)?;
        }
        // The generated program is rebuilt only when its source changes: even at -O0 it is
        // gcc's largest job here.
        let big = self.dir.join("big.c");
        let source = generate_big(BIG_LEVELS, BIG_PER_LEVEL, 0x5eed);
        let binary = self.dir.join("big");
        if fs::read_to_string(&big).ok().as_deref() != Some(source.as_str()) || !binary.exists() {
            fs::write(&big, &source)?;
            self.cc(&big, "big", BIG_CFLAGS)?;
        }
        let out = Command::new(self.dir.join("startup"))
            .arg("--calibrate")
            .output()?;
        let rate = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("tsc_per_ns "))
            .context("startup --calibrate printed no rate")?
            .trim()
            .to_string();
        let _ = self.tsc_per_ns.set(rate);
        Ok(())
    }

    /// `bench/startup.c`'s argv.
    fn startup_argv(&self) -> Vec<OsString> {
        let rate = self.tsc_per_ns.get().map_or("1", String::as_str);
        self.workload("startup", &[rate])
    }

    fn cc(&self, source: &Path, name: &str, flags: &[&str]) -> Result<()> {
        crate::cmd::run(
            Command::new("gcc")
                .args(flags)
                .arg("-I")
                .arg(self.root.join("bench"))
                .arg("-o")
                .arg(self.dir.join(name))
                .arg(source),
        )
    }

    /// The argv of workload `name`.
    fn workload(&self, name: &str, args: &[&str]) -> Vec<OsString> {
        let mut argv = vec![self.dir.join(name).into_os_string()];
        argv.extend(args.iter().map(OsString::from));
        argv
    }

    /// Starts a workload to attach to; it runs until [`stop_target`].
    fn spawn_target(&self, name: &str, args: &[&str]) -> Result<Child> {
        let child = Command::new(self.dir.join(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        // Let it reach its steady state (threads started, libraries mapped).
        std::thread::sleep(Duration::from_millis(300));
        Ok(child)
    }

    /// The argv of `tool` sampling at `hz` and launching `argv`; the second value says the
    /// workload must linger (bpftrace, see `bench/common.h`).
    fn launch_command(&self, tool: Option<Tool>, hz: u64, argv: &[OsString]) -> (Command, bool) {
        let out = self.dir.join("run");
        let hz_s = hz.to_string();
        match tool {
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                (c, false)
            }
            Some(tool @ (Tool::Bpfprof | Tool::BpfprofFixed)) => {
                let mut c = Command::new(&self.bpfprof);
                c.args(["-q", "-F", &hz_s, "-o"])
                    .arg(out.with_extension("folded"))
                    .arg("--summary-json")
                    .arg(out.with_extension("json"));
                if tool == Tool::BpfprofFixed {
                    c.arg("--fixed-interval");
                }
                c.arg("--").args(argv);
                (c, false)
            }
            Some(Tool::Perf) => {
                let mut c = Command::new("perf");
                c.args(["record", "-q", "-e", "cpu-clock", "-g", "-F", &hz_s, "-o"])
                    .arg(out.with_extension("perf"))
                    .arg("--")
                    .args(argv);
                (c, false)
            }
            Some(Tool::Bpftrace) => {
                let mut c = Command::new("bpftrace");
                c.args(["-q", "-o"])
                    .arg(out.with_extension("bt"))
                    .arg("-e")
                    .arg(format!(
                        "profile:hz:{hz} /pid == cpid/ {{ @[ustack, kstack] = count(); }}"
                    ))
                    .arg("-c")
                    .arg(join(argv.iter().map(|a| a.to_string_lossy()), " "));
                (c, true)
            }
        }
    }

    /// Runs `argv` under `tool` (or alone) in launch mode: the profiler starts the workload,
    /// sampling from its first instruction, and ends when it ends. With `stacks`, the profile
    /// is read back.
    ///
    /// A run that fails is run once more, with a warning: bpftrace has been seen to hang,
    /// once in several full benches, after the SIGINT that ends it.
    fn launch(
        &self,
        tool: Option<Tool>,
        hz: u64,
        argv: &[OsString],
        stacks: bool,
    ) -> Result<Launched> {
        self.launch_once(tool, hz, argv, stacks).or_else(|e| {
            println!("    warning: run failed, running it again: {e:#}");
            self.launch_once(tool, hz, argv, stacks)
        })
    }

    fn launch_once(
        &self,
        tool: Option<Tool>,
        hz: u64,
        argv: &[OsString],
        stacks: bool,
    ) -> Result<Launched> {
        let out = self.dir.join("run");
        for ext in ["folded", "json", "perf", "bt"] {
            let _ = fs::remove_file(out.with_extension(ext));
        }
        let (mut cmd, linger) = self.launch_command(tool, hz, argv);
        if linger {
            cmd.env("BENCH_LINGER", "1");
        }
        let stderr = self.dir.join("run.stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr)?);
        let spawned_ns = mono_ns();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&cmd)))?;
        let monitor = Monitor::new(child.id() as i32, LAUNCH_LIMIT);
        // The workload's stdout comes through the profiler (its child inherits it).
        let mut lines = Vec::new();
        for line in BufReader::new(child.stdout.take().context("stdout")?).lines() {
            let line = line?;
            if line == "done" && linger {
                // bpftrace prints its map (resolving user stacks while the workload still
                // lives), then ends the workload.
                signal(&child, libc::SIGINT);
            }
            lines.push(line);
        }
        let (status, _) = wait_usage(&mut child, monitor)?;
        ensure!(
            status == 0,
            "`{}` exited with status {status}: {}",
            crate::cmd::describe(&cmd),
            tail(&stderr)
        );
        let stacks = match tool {
            Some(tool) if stacks => self.read_profile(tool, &out)?.0,
            Some(tool) if tool.is_bpfprof_like() => {
                // Not read for stacks, but bpfprof's drops are always counted.
                let summary = fs::read(out.with_extension("json"))?;
                self.note_losses(&serde_json::from_slice(&summary)?);
                Stacks::new()
            }
            _ => Stacks::new(),
        };
        Ok(Launched {
            lines,
            spawned_ns,
            stacks,
        })
    }

    /// Reads the profile a run left in `out.*`: stacks, bpfprof's summary, bpftrace's `@n`.
    fn read_profile(&self, tool: Tool, out: &Path) -> Result<(Stacks, Option<Value>, Option<u64>)> {
        Ok(match tool {
            Tool::Bpfprof | Tool::BpfprofFixed => {
                let summary: Value = serde_json::from_slice(&fs::read(out.with_extension("json"))?)
                    .context("bpfprof's summary")?;
                self.note_losses(&summary);
                let folded = fs::read_to_string(out.with_extension("folded"))?;
                (bpfprof_stacks(&folded), Some(summary), None)
            }
            Tool::Perf => (perf_stacks(&out.with_extension("perf"))?.0, None, None),
            Tool::Bpftrace => {
                let (stacks, fired) =
                    bpftrace_stacks(&fs::read_to_string(out.with_extension("bt"))?);
                (stacks, None, fired)
            }
        })
    }

    fn note_losses(&self, summary: &Value) {
        if let Some(lost) = summary["lost"].as_object() {
            let mut all = self.bpfprof_losses.borrow_mut();
            for (k, v) in lost {
                if k != "truncated" {
                    *all.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
        }
    }

    /// Starts `tool` sampling process `pid` at `hz`.
    fn attach_start(&self, tool: Tool, hz: u64, pid: i32, opts: AttachOpts) -> Result<Running> {
        // Not `run.*`: an attached profiler may be running while a launched one starts (the
        // timer floor of section 1), and bpfprof opens its outputs when it starts.
        let out = self.dir.join("attach");
        for ext in ["folded", "json", "perf", "bt"] {
            let _ = fs::remove_file(out.with_extension(ext));
        }
        let hz_s = hz.to_string();
        let mut stats_guard = None;
        let mut cmd = match tool {
            Tool::Bpfprof | Tool::BpfprofFixed => {
                let mut c = Command::new(&self.bpfprof);
                c.args(["-q", "-F", &hz_s, "--pid", &pid.to_string(), "-o"])
                    .arg(out.with_extension("folded"))
                    .arg("--summary-json")
                    .arg(out.with_extension("json"));
                if tool == Tool::BpfprofFixed {
                    c.arg("--fixed-interval");
                }
                if opts.bpf_stats {
                    c.arg("--bpf-stats");
                }
                c
            }
            Tool::Perf => {
                let mut c = Command::new("perf");
                c.args(["record", "-q", "-e", "cpu-clock", "-g", "-F", &hz_s, "-p"])
                    .arg(pid.to_string())
                    .arg("-o")
                    .arg(out.with_extension("perf"));
                c
            }
            Tool::Bpftrace => {
                let mut prog =
                    format!("profile:hz:{hz} /pid == {pid}/ {{ @s[ustack, kstack] = count();");
                if opts.count_fired {
                    prog += " @n = count();";
                }
                prog += " }";
                if let Some(secs) = opts.bpftrace_exit_after {
                    prog += &format!(" interval:s:{secs} {{ exit(); }}");
                }
                if opts.bpf_stats {
                    stats_guard = Some(BpfStatsGuard::enable()?);
                }
                let mut c = Command::new("bpftrace");
                c.args(["-q", "-o"])
                    .arg(out.with_extension("bt"))
                    .arg("-e")
                    .arg(prog);
                // Symbols cached per executable, as bpftrace does by default under `-c`.
                // Attached by pid, 0.17 defaults to reloading them for every stack it prints:
                // on section 4's 4096 stacks that took over four minutes in a trial (stopped
                // there), which would make the comparison about a setting.
                c.env("BPFTRACE_CACHE_USER_SYMBOLS", "1");
                c
            }
        };
        let stderr = self.dir.join("attach.stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr)?);
        let target = (pid, proc_cpu_secs(pid), Instant::now());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&cmd)))?;
        Ok(Running {
            tool,
            monitor: Monitor::new(child.id() as i32, RUN_LIMIT),
            target,
            child,
            out,
            stderr,
            opts,
            stats_guard,
        })
    }

    /// Attaches `tool` to `pid` for [`ATTACH_SECS`], stops it and reads what it wrote.
    fn attach_for(&self, tool: Tool, hz: u64, pid: i32, opts: AttachOpts) -> Result<Attached> {
        let running = self.attach_start(tool, hz, pid, opts)?;
        // bpftrace with an exit interval stops itself; the others are stopped by signal.
        std::thread::sleep(Duration::from_secs_f64(ATTACH_SECS));
        self.stop(running)
    }

    /// Stops a running profiler with SIGINT (unless it stops itself) and reads its profile.
    fn stop(&self, mut r: Running) -> Result<Attached> {
        let bpf_stats = match (&r.stats_guard, r.tool) {
            (Some(_), Tool::Bpftrace) => bpftrace_prog_stats(r.child.id()),
            _ => None,
        };
        // Up to the stop, not after: perf's post-processing below competes with the target.
        let (target, cpu0, since) = r.target;
        let target_cpus = cpu0
            .zip(proc_cpu_secs(target))
            .map(|(c0, c1)| (c1 - c0) / since.elapsed().as_secs_f64());
        let self_exiting = r.tool == Tool::Bpftrace && r.opts.bpftrace_exit_after.is_some();
        let signalled = Instant::now();
        if !self_exiting {
            signal(&r.child, libc::SIGINT);
        }
        let (status, usage) = wait_usage(&mut r.child, r.monitor)?;
        let stop_secs = signalled.elapsed().as_secs_f64();
        drop(r.stats_guard.take());
        // bpfprof exits 130 when interrupted (its profile written); perf and bpftrace 0.
        ensure!(
            status == 0 || status == 130,
            "{} exited with status {status}: {}",
            r.tool.name(),
            tail(&r.stderr)
        );
        let mut attached = Attached {
            stacks: Stacks::new(),
            usage,
            stop_secs,
            post: None,
            summary: None,
            drops: None,
            fired: None,
            bpf_stats,
            span_secs: None,
            target_cpus,
        };
        match r.tool {
            Tool::Bpfprof | Tool::BpfprofFixed => {
                let (stacks, summary, _) = self.read_profile(r.tool, &r.out)?;
                attached.drops = summary.as_ref().map(drops);
                attached.stacks = stacks;
                attached.summary = summary;
            }
            Tool::Perf => {
                let data = r.out.with_extension("perf");
                let (stacks, post) = perf_stacks(&data)?;
                attached.stacks = stacks;
                attached.post = Some(post);
                let (lost, span) = perf_stats(&data);
                attached.drops = lost;
                attached.span_secs = span;
            }
            Tool::Bpftrace => {
                let text = fs::read_to_string(r.out.with_extension("bt"))?;
                let (stacks, fired) = bpftrace_stacks(&text);
                // Stacks bpftrace could not record print empty; they are drops too.
                let empty = stacks.get("").copied().unwrap_or(0);
                let kept: u64 = stacks.values().sum::<u64>() - empty;
                attached.drops = fired.map(|f| f.saturating_sub(kept) + empty.min(f));
                attached.fired = fired;
                attached.stacks = stacks;
                attached.stacks.remove("");
            }
        }
        Ok(attached)
    }

    /// Attach-mode start-up: the profiler starts against `bench/startup.c` already running;
    /// returns ms from the profiler's spawn to its first sample.
    fn attach_startup(&self, tool: Tool, hz: u64) -> Result<Option<f64>> {
        let (mut workload, start, mut lines) = self.spawn_startup()?;
        // Some way into the slots, so the first sample lands in one whatever the latency.
        std::thread::sleep(Duration::from_millis(50));
        let t0 = mono_ns();
        let running = self.attach_start(tool, hz, workload.id() as i32, AttachOpts::default());
        let result = running.and_then(|running| {
            wait_for(&mut lines, "done")?;
            self.stop(running)
        });
        stop_target(&mut workload);
        Ok(first_sample_ns(&result?.stacks, start).map(|t| (t as f64 - t0 as f64) / 1e6))
    }

    /// Starts `bench/startup.c` lingering, returning it, its start time and its stdout.
    fn spawn_startup(&self) -> Result<(Child, u64, std::io::Lines<BufReader<ChildStdout>>)> {
        let argv = self.startup_argv();
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("BENCH_LINGER", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let start = wait_for(&mut lines, "start ")?
            .strip_prefix("start ")
            .and_then(|s| s.parse().ok())
            .context("startup's start line")?;
        Ok((child, start, lines))
    }

    /// The daemon's start-up: a fresh daemon, then two runs against `bench/startup.c` (the
    /// first loads the kernel program, the next reuses it). Returns, per run, ms from `run`'s
    /// spawn to its exit (it exits once the run is RUNNING) and to the first sample.
    fn daemon_startup(&self, hz: u64) -> Result<Vec<(f64, Option<f64>)>> {
        let sock = self.dir.join("daemon.sock");
        let state = self.dir.join("daemon-state");
        let _ = fs::remove_file(&sock);
        let _ = fs::remove_dir_all(&state);
        let mut daemon = Command::new(&self.bpfprof)
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--state-dir")
            .arg(&state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(self.dir.join("daemon.stderr"))?)
            .spawn()?;
        let result = (|| -> Result<Vec<(f64, Option<f64>)>> {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !sock.exists() {
                ensure!(
                    Instant::now() < deadline,
                    "the daemon did not create its socket: {}",
                    tail(&self.dir.join("daemon.stderr"))
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut out = Vec::new();
            for _ in 0..2 {
                let (mut workload, start, mut lines) = self.spawn_startup()?;
                std::thread::sleep(Duration::from_millis(50));
                let t0 = mono_ns();
                let reply = Command::new(&self.bpfprof)
                    .args([
                        "run",
                        "--async",
                        "--duration-ms",
                        "300",
                        "--formats",
                        "folded",
                    ])
                    .args(["-F", &hz.to_string(), "--pid", &workload.id().to_string()])
                    .arg("--socket")
                    .arg(&sock)
                    .output()?;
                let running_ms = (mono_ns() - t0) as f64 / 1e6;
                let stdout = String::from_utf8_lossy(&reply.stdout);
                ensure!(
                    reply.status.success(),
                    "bpfprof run: {}{}",
                    stdout,
                    String::from_utf8_lossy(&reply.stderr)
                );
                let id = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("Run Id: "))
                    .context("no `Run Id:` from bpfprof run")?
                    .trim()
                    .to_string();
                let results = Command::new(&self.bpfprof)
                    .args([
                        "results", "--run-id", &id, "--wait", "30s", "--json", "--socket",
                    ])
                    .arg(&sock)
                    .output()?;
                let _ = wait_for(&mut lines, "done");
                stop_target(&mut workload);
                let reply: Value =
                    serde_json::from_slice(&results.stdout).context("bpfprof results --json")?;
                let folded = reply["files"]["folded"]
                    .as_str()
                    .context("no folded file in the run's results")?;
                let summary = &reply["summary"];
                self.note_losses(summary);
                let stacks = bpfprof_stacks(&fs::read_to_string(folded)?);
                let first = first_sample_ns(&stacks, start).map(|t| (t as f64 - t0 as f64) / 1e6);
                out.push((running_ms, first));
            }
            Ok(out)
        })();
        signal(&daemon, libc::SIGTERM);
        let _ = daemon.wait();
        result
    }

    /// The machine and tool versions, for the report's first paragraph.
    fn machine(&self) -> Result<String> {
        let out = |c: &str, a: &[&str]| {
            crate::cmd::probe(Command::new(c).args(a))
                .map(|s| s.lines().next().unwrap_or("").trim().to_string())
                .unwrap_or_else(|| "?".into())
        };
        let cpu = fs::read_to_string("/proc/cpuinfo")?
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("?")
            .trim()
            .to_string();
        let mem_gib = fs::read_to_string("/proc/meminfo")?
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or("?".into(), |kb| format!("{:.0} GiB", kb / 1048576.0));
        let bpfprof = out(self.bpfprof.to_str().unwrap_or("bpfprof"), &["--version"]);
        let rev = out(
            "git",
            &[
                "-C",
                self.root.to_str().unwrap_or("."),
                "describe",
                "--always",
                "--dirty",
            ],
        );
        Ok(format!(
            "Date {}; machine: {} CPUs ({cpu}), {mem_gib} RAM, kernel {}; {}; {}; {bpfprof} (git {rev}); {}. Sampling event: cpu-clock for all three (no hardware PMU here).",
            out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            self.cpus,
            out("uname", &["-r"]),
            out("perf", &["--version"]),
            out("bpftrace", &["--version"]),
            out("gcc", &["--version"]),
        ))
    }
}

/// The drops a bpfprof summary reports: every loss counter but `truncated` (a truncated stack
/// is kept, under a `[truncated]` root).
fn drops(summary: &Value) -> u64 {
    summary["lost"].as_object().map_or(0, |o| {
        o.iter()
            .filter(|(k, _)| *k != "truncated")
            .filter_map(|(_, v)| v.as_u64())
            .sum()
    })
}

/// Reads lines until one starts with `prefix`, returning it.
fn wait_for(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    prefix: &str,
) -> Result<String> {
    for line in lines {
        let line = line?;
        if line.starts_with(prefix) {
            return Ok(line);
        }
    }
    bail!("the workload ended without printing {prefix:?}")
}

fn stop_target(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Waits for `child`, returning its exit status (128 + signal if killed), its CPU time (from
/// `wait4`) and its peak RSS (from `monitor`).
///
/// Not `wait4`'s `ru_maxrss`: a child spawned with vfork, as `Command` does, records the
/// parent's peak at its exec, so it would report xtask's memory whenever that is larger.
fn wait_usage(child: &mut Child, monitor: Monitor) -> Result<(i32, Usage)> {
    let pid = child.id() as i32;
    // Wait for the exit without reaping, so that the monitor can no longer signal a pid that
    // might be reused once reaped.
    loop {
        // SAFETY: an all-zero siginfo is valid; waitid fills it for our own child.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid out-pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        ensure!(
            err.kind() == std::io::ErrorKind::Interrupted,
            "waitid({pid}): {err}"
        );
    }
    let (peak_kib, last_kib) = monitor.finish();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid out-pointers.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        ensure!(
            err.kind() == std::io::ErrorKind::Interrupted,
            "wait4({pid}): {err}"
        );
    }
    // Reaped here, behind `Child`'s back: callers must not signal or wait for it again.
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        code,
        Usage {
            cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
            max_rss_kib: peak_kib,
            last_rss_kib: last_kib,
        },
    ))
}

/// CLOCK_MONOTONIC in ns: the clock the workloads print, and bpftrace's `nsecs`.
fn mono_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Watches a child: its peak RSS (`VmHWM`, a high-water mark, read every few milliseconds, so
/// only growth in its last milliseconds can be missed), and a watchdog that kills it if it
/// outlives its limit (a hung profiler must not hang the bench).
struct Monitor {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(f64, f64)>>,
}

impl Monitor {
    /// Starts watching `pid`, which must have exec'd already (as it has when `spawn` returns).
    fn new(pid: i32, limit: Duration) -> Monitor {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            let (mut peak, mut last) = (0f64, f64::NAN);
            while !flag.load(Ordering::Relaxed) {
                if let Some((hwm, rss)) = vm_kib(pid) {
                    peak = peak.max(hwm);
                    last = rss;
                }
                if Instant::now() > deadline {
                    eprintln!("xtask bench: pid {pid} ran past {limit:?}, killing it");
                    // SAFETY: our child, not reaped before `finish` has joined this thread.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (peak, last)
        });
        Monitor {
            done,
            thread: Some(thread),
        }
    }

    /// Stops watching; returns the peak RSS and the last RSS seen, in KiB.
    fn finish(mut self) -> (f64, f64) {
        self.done.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or((f64::NAN, f64::NAN))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// The peak RSS of process `pid` so far and its RSS now, in KiB.
fn vm_kib(pid: i32) -> Option<(f64, f64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// Turns on `kernel.bpf_stats_enabled` and restores its old value when dropped.
struct BpfStatsGuard {
    old: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatsGuard {
    fn enable() -> Result<BpfStatsGuard> {
        let old = fs::read_to_string(BPF_STATS)?.trim().to_string();
        fs::write(BPF_STATS, "1").context("enabling BPF statistics")?;
        Ok(BpfStatsGuard { old })
    }
}

impl Drop for BpfStatsGuard {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, &self.old);
    }
}

/// Run time and count of bpftrace's perf_event programs (its `profile` probe), summed.
///
/// Read from the fdinfo of the program fds bpftrace holds (`bpftool prog show` would need to
/// be built with pid support to say which programs are bpftrace's).
fn bpftrace_prog_stats(pid: u32) -> Option<(u64, u64)> {
    let mut total = (0, 0);
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?.flatten() {
        let Ok(info) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // BPF_PROG_TYPE_PERF_EVENT: the `profile` probe.
        if field("prog_type") == Some(7) {
            total.0 += field("run_time_ns").unwrap_or(0);
            total.1 += field("run_cnt").unwrap_or(0);
        }
    }
    (total.1 > 0).then_some(total)
}

/// CPU seconds process `pid` has used (user + system, all threads), from `/proc/PID/stat`.
fn proc_cpu_secs(pid: i32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name, which may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}

// -------------------------------------------------------------------------------------------
// Reading the three profilers' output
// -------------------------------------------------------------------------------------------

/// bpfprof's folded output (`comm;root;...;leaf COUNT`), without the process name.
fn bpfprof_stacks(text: &str) -> Stacks {
    fold_lines(text.lines(), true)
}

fn fold_lines<'a>(lines: impl Iterator<Item = &'a str>, drop_comm: bool) -> Stacks {
    let mut stacks = Stacks::new();
    for line in lines {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.trim().parse::<u64>() else {
            continue;
        };
        let stack = if drop_comm {
            stack.split_once(';').map_or("", |(_, rest)| rest)
        } else {
            stack
        };
        *stacks.entry(stack.to_string()).or_default() += count;
    }
    stacks
}

/// Runs `perf script` on `data` and folds its output with inferno; returns the stacks and what
/// it cost.
fn perf_stacks(data: &Path) -> Result<(Stacks, PostCost)> {
    let started = Instant::now();
    let script_out = data.with_extension("script");
    // The default fields but the period, which inferno would weight each sample by.
    let mut child = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(data)
        .args(["-F", "comm,tid,time,event,ip,sym,dso"])
        .stdin(Stdio::null())
        .stdout(File::create(&script_out)?)
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf script")?;
    let monitor = Monitor::new(child.id() as i32, RUN_LIMIT);
    let (status, usage) = wait_usage(&mut child, monitor)?;
    ensure!(
        status == 0,
        "perf script -i {} failed ({status})",
        data.display()
    );
    let mut text = Vec::new();
    File::open(&script_out)?.read_to_end(&mut text)?;
    let mut options = inferno::collapse::perf::Options::default();
    options.annotate_kernel = true;
    // Unresolved frames stay as addresses, as in the other two profilers' output.
    options.include_addrs = true;
    let mut folder = inferno::collapse::perf::Folder::from(options);
    let mut folded = Vec::new();
    inferno::collapse::Collapse::collapse(&mut folder, &text[..], &mut folded)
        .context("folding perf script output")?;
    let stacks = fold_lines(String::from_utf8_lossy(&folded).lines(), true);
    let _ = fs::remove_file(&script_out);
    Ok((
        stacks,
        PostCost {
            secs: started.elapsed().as_secs_f64(),
            usage,
        },
    ))
}

/// perf's lost records (`perf report --stats`) and the first-to-last sample span in seconds.
fn perf_stats(data: &Path) -> (Option<u64>, Option<f64>) {
    let stats = crate::cmd::probe(
        Command::new("perf")
            .arg("report")
            .arg("-i")
            .arg(data)
            .arg("--stats"),
    );
    let lost = stats.map(|s| {
        s.lines()
            .filter(|l| l.contains("LOST"))
            .filter_map(|l| {
                l.split(':')
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    });
    let times = crate::cmd::probe(
        Command::new("perf")
            .arg("script")
            .arg("-i")
            .arg(data)
            .args(["-F", "time"]),
    );
    let span = times.and_then(|t| {
        let parse = |l: &str| l.trim().trim_end_matches(':').parse::<f64>().ok();
        let mut v = t.lines().filter_map(parse);
        let first = v.next()?;
        let last = v.next_back()?;
        Some(last - first)
    });
    (lost, span)
}

/// Parses bpftrace's printed maps. A stack map entry is
///
/// ```text
/// @s[
///     user_leaf+12
///     main+34
/// ,
///     kernel_leaf+5
/// ]: 17
/// ```
///
/// (user frames, a comma, kernel frames, leaf first; an entry with no kernel stack ends
/// `, ]: N`). Frames lose their `+offset`; kernel frames get `_[k]`. A `@n: N` line is the
/// fired-samples counter.
fn bpftrace_stacks(text: &str) -> (Stacks, Option<u64>) {
    let mut stacks = Stacks::new();
    let mut fired = None;
    let mut user: Vec<String> = Vec::new();
    let mut kernel: Vec<String> = Vec::new();
    let mut in_kernel = false;
    let mut in_entry = false;
    for line in text.lines() {
        let t = line.trim();
        if let Some(n) = t.strip_prefix("@n: ") {
            fired = n.trim().parse().ok();
            continue;
        }
        if t.starts_with('@') && t.ends_with('[') {
            (in_entry, in_kernel) = (true, false);
            user.clear();
            kernel.clear();
            continue;
        }
        if !in_entry {
            continue;
        }
        let end = if let Some(rest) = t.strip_prefix(',') {
            in_kernel = true;
            rest.trim()
        } else {
            t
        };
        if let Some(count) = end.strip_prefix("]:") {
            if let Ok(n) = count.trim().parse::<u64>() {
                let frames = user
                    .iter()
                    .rev()
                    .cloned()
                    .chain(kernel.iter().rev().map(|f| format!("{f}_[k]")));
                *stacks.entry(join(frames, ";")).or_default() += n;
            }
            in_entry = false;
        } else if !end.is_empty() {
            let frame = strip_offset(end).to_string();
            if in_kernel { &mut kernel } else { &mut user }.push(frame);
        }
    }
    (stacks, fired)
}

/// `func+123` -> `func`; addresses and names without an offset stay as they are.
fn strip_offset(frame: &str) -> &str {
    match frame.rsplit_once('+') {
        Some((name, off)) if !name.is_empty() && off.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => frame,
    }
}

/// Share of `a` in samples attributed to `a` or `b`, in percent, and that sample count. A
/// sample is attributed to whichever of the two is nearest the leaf on its stack.
fn share_of(stacks: &Stacks, a: &str, b: &str) -> Result<(f64, u64)> {
    let (mut na, mut nb) = (0, 0);
    for (stack, &n) in stacks {
        match stack.rsplit(';').find(|f| *f == a || *f == b) {
            Some(f) if f == a => na += n,
            Some(_) => nb += n,
            None => {}
        }
    }
    ensure!(na + nb > 0, "no samples in {a} or {b}");
    Ok((100.0 * na as f64 / (na + nb) as f64, na + nb))
}

/// The time of the first sample of `bench/startup.c` that started at `start_ns`: the middle
/// of the earliest `slot_k` millisecond on any stack.
fn first_sample_ns(stacks: &Stacks, start_ns: u64) -> Option<u64> {
    stacks
        .keys()
        .flat_map(|s| s.split(';'))
        .filter_map(|f| f.strip_prefix("slot_")?.parse::<u64>().ok())
        .min()
        .map(|k| start_ns + k * 1_000_000 + 500_000)
}

/// Frames of a folded profile: its unique stacks' depths, summed.
fn frames_of(stacks: &Stacks) -> u64 {
    stacks
        .keys()
        .map(|s| s.split(';').filter(|f| !f.is_empty()).count() as u64)
        .sum()
}

// -------------------------------------------------------------------------------------------
// The generated large binary
// -------------------------------------------------------------------------------------------

/// C source of a program with `levels * per_level` functions in a layered call tree: each
/// function does a little work and calls one of three functions of the next level, chosen by
/// the path being walked, or (one time in 16, and always at the last level) stops there with a
/// longer spin. A path is a number; each thread draws paths at random, all of them, or one of
/// only K when given K > 0, so the number of unique stacks can be dialed. The tree's shape
/// comes from `seed` (a fixed xorshift), so every build is the same program.
///
/// usage: big THREADS K
fn generate_big(levels: usize, per_level: usize, seed: u64) -> String {
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let name = |l: usize, i: usize| format!("big_l{l:02}_f{i:03}");
    let mut c = String::new();
    c.push_str("/* Generated by xtask/src/bench.rs (generate_big): do not edit. */\n");
    c.push_str("#include <pthread.h>\n#include \"common.h\"\n\n");
    c.push_str("static inline uint64_t mix(uint64_t x) {\n    x ^= x >> 31; x *= 0x7fb5d329728ea185ull; x ^= x >> 27; x *= 0x81dadef4bc2dd44dull; return x ^ (x >> 33);\n}\n");
    c.push_str("static inline uint64_t spin(uint64_t x, uint64_t n, uint64_t k) {\n    for (uint64_t i = 0; i < n; i++) x = x * 6364136223846793005ull + k;\n    return x;\n}\n\n");
    for l in 0..levels {
        for i in 0..per_level {
            writeln!(c, "uint64_t {}(uint64_t p, uint64_t x);", name(l, i)).unwrap();
        }
    }
    for l in 0..levels {
        for i in 0..per_level {
            let k = 2 * (l * per_level + i) as u64 + 1;
            writeln!(
                c,
                "__attribute__((noinline)) uint64_t {}(uint64_t p, uint64_t x) {{",
                name(l, i)
            )
            .unwrap();
            if l + 1 == levels {
                writeln!(
                    c,
                    "    x = spin(x, 3000, {k}ull);\n    keep_frame(x);\n    return x;\n}}"
                )
                .unwrap();
                continue;
            }
            writeln!(c, "    x = spin(x, 20, {k}ull);").unwrap();
            writeln!(c, "    uint64_t h = mix(p * {} + {l});", levels + 1).unwrap();
            writeln!(c, "    if (h % 16 == 0) return spin(x, 3000, {k}ull);").unwrap();
            writeln!(c, "    switch ((h >> 8) % 3) {{").unwrap();
            for (case, _) in ["0", "1", "default"].iter().enumerate() {
                let callee = name(l + 1, (next() % per_level as u64) as usize);
                let label = if case == 2 {
                    "default".to_string()
                } else {
                    format!("case {case}")
                };
                writeln!(c, "    {label}: return {callee}(p, x) + 1;").unwrap();
            }
            writeln!(c, "    }}\n}}").unwrap();
        }
    }
    write!(
        c,
        "static uint64_t (*const roots[{per_level}])(uint64_t, uint64_t) = {{"
    )
    .unwrap();
    for i in 0..per_level {
        write!(
            c,
            "{}{}",
            if i % 6 == 0 { "\n    " } else { " " },
            name(0, i)
        )
        .unwrap();
        c.push(',');
    }
    c.push_str("\n};\n\n");
    c.push_str(
        r#"static uint64_t limit;

static void *worker(void *arg) {
    uint64_t s = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1, x = 1;
    for (;;) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        uint64_t p = limit ? s % limit : s;
"#,
    );
    writeln!(c, "        x += roots[mix(p) % {per_level}](p, x);").unwrap();
    c.push_str(
        r#"    }
    return (void *)(uintptr_t)x;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: big THREADS K\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    limit = strtoull(argv[2], 0, 10);
    pthread_t t[256];
    for (int i = 0; i < threads && i < 256; i++)
        pthread_create(&t[i], 0, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads && i < 256; i++)
        pthread_join(t[i], 0);
    return 0;
}
"#,
    );
    c
}

// -------------------------------------------------------------------------------------------
// Statistics, tables and the plot
// -------------------------------------------------------------------------------------------

/// Rotates `order` left by `round`: each round starts with a different profiler.
fn rotate<T>(order: &mut [T], round: usize) {
    let n = order.len().max(1);
    order.rotate_left(round % n);
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The median (the mean of the middle two for an even count); NaN for no values.
fn median(v: &[f64]) -> f64 {
    let v = sorted(v);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `median (min–max)`, or the single value, or `n/a` (with how many runs had no value).
fn stat(v: &[f64], digits: usize) -> String {
    let s = sorted(v);
    let missing = v.len() - s.len();
    let note = if missing > 0 {
        format!(" [{missing} of {} runs: no value]", v.len())
    } else {
        String::new()
    };
    match s.len() {
        0 => format!("n/a{note}"),
        1 => format!("{:.digits$}{note}", s[0]),
        _ => format!(
            "{:.digits$} ({:.digits$}–{:.digits$}){note}",
            median(&s),
            s[0],
            s[s.len() - 1]
        ),
    }
}

fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>, sep: &str) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

/// A profiler × frequency table.
fn table(
    md: &mut String,
    tools: &[Tool],
    freqs: &[u64],
    cell: impl Fn(Tool, u64) -> String,
) -> Result<()> {
    writeln!(
        md,
        "| profiler | {} |",
        join(freqs.iter().map(|hz| format!("{hz} Hz")), " | ")
    )?;
    writeln!(md, "|---|{}", "---|".repeat(freqs.len()))?;
    for &tool in tools {
        writeln!(
            md,
            "| {} | {} |",
            tool.name(),
            join(freqs.iter().map(|&hz| cell(tool, hz)), " | ")
        )?;
    }
    Ok(())
}

/// The overhead plot: slowdown against frequency (log), one line per profiler, min–max
/// whiskers; points are nudged sideways per profiler so that whiskers do not hide each other.
fn plot(path: &Path, freqs: &[u64], overhead: &BTreeMap<(Arm, u64), Vec<f64>>) -> Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (820, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let all: Vec<f64> = overhead.values().flatten().copied().collect();
    let hi = all.iter().copied().fold(1.0f64, f64::max);
    let lo = all.iter().copied().fold(1.0f64, f64::min);
    let pad = (hi - lo).max(0.05) * 0.08;
    let (xmin, xmax) = (
        *freqs.first().unwrap_or(&99) as f64 * 0.6,
        *freqs.last().unwrap_or(&4999) as f64 * 1.6,
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Workload slowdown under each profiler (median, min–max whiskers)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((xmin..xmax).log_scale(), (lo - pad)..(hi + pad))?;
    chart
        .configure_mesh()
        .x_desc("sampling frequency, Hz (log scale)")
        .y_desc("time under profiler / time alone")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(xmin, 1.0), (xmax, 1.0)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    // The three profilers, then the timer floor in grey.
    let arms = [
        (Arm::Under(Tool::Bpfprof), RGBColor(200, 40, 40), 0.92),
        (Arm::Under(Tool::Perf), RGBColor(30, 90, 200), 0.97),
        (Arm::Under(Tool::Bpftrace), RGBColor(20, 140, 60), 1.03),
        (Arm::Floor, RGBColor(130, 130, 130), 1.08),
    ];
    for (arm, color, nudge) in arms {
        let points: Vec<(f64, f64, f64, f64)> = freqs
            .iter()
            .filter_map(|&hz| {
                let v = sorted(overhead.get(&(arm, hz))?);
                (!v.is_empty()).then(|| (hz as f64 * nudge, median(&v), v[0], v[v.len() - 1]))
            })
            .collect();
        let line = points.iter().map(|p| (p.0, p.1));
        // The floor is a reference, not a profiler: dashed.
        let series = if arm == Arm::Floor {
            chart.draw_series(DashedLineSeries::new(line, 6, 4, color.stroke_width(2)))?
        } else {
            chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?
        };
        series.label(arm.name()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        chart.draw_series(
            points
                .iter()
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(1))),
        )?;
        chart.draw_series(points.iter().flat_map(|p| {
            [p.2, p.3].map(|y| {
                PathElement::new(
                    vec![(p.0 * 0.985, y), (p.0 * 1.015, y)],
                    color.stroke_width(1),
                )
            })
        }))?;
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_map_parses_user_and_kernel_frames() {
        let text = "\n\n@n: 5\n@s[\n    leaf_hot+21\n    main+64\n, \n    irq_exit+3\n    asm_sysvec+22\n]: 3\n@s[\n    0x7f00\n    leaf_cold+9\n, ]: 2\n";
        let (stacks, fired) = bpftrace_stacks(text);
        assert_eq!(fired, Some(5));
        assert_eq!(stacks["main;leaf_hot;asm_sysvec_[k];irq_exit_[k]"], 3);
        assert_eq!(stacks["leaf_cold;0x7f00"], 2);
        assert_eq!(share_of(&stacks, "leaf_hot", "leaf_cold").unwrap().0, 60.0);
    }

    #[test]
    fn folded_lines_drop_the_process_name() {
        let stacks = bpfprof_stacks("split;main;leaf_hot 7\nsplit;main;slot_012 1\nbad line\n");
        assert_eq!(stacks["main;leaf_hot"], 7);
        assert_eq!(first_sample_ns(&stacks, 1000), Some(1000 + 12_500_000));
        assert_eq!(frames_of(&stacks), 4);
    }

    #[test]
    fn stats() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(stat(&[1.0, f64::NAN], 1), "1.0 [1 of 2 runs: no value]");
        assert_eq!(strip_offset("f+12"), "f");
        assert_eq!(strip_offset("0x7f+ab"), "0x7f+ab");
    }
}
