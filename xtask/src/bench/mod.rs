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
//!
//! Layout: this file is the entry point ([`run`]) and the [`Bench`] context; `plan.rs` holds
//! what a run measures and every constant; one file per section of the report (`overhead.rs`
//! 1, `accuracy.rs` 2, `startup.rs` 3, `end_of_run.rs` 4, `own_cost.rs` 5, `scale.rs` 6,
//! `kernel_unwind.rs` 7, `table_build.rs` 8, `unwind_startup.rs` 9, `dwarf_overhead.rs` 10,
//! `python.rs` 11, `agent.rs` 12, `export.rs` 13, `off_cpu.rs` 14, `cost.rs` 15, `asyncio.rs` 16,
//! `managed.rs` 17, `why.rs` the closing one, `unwind.rs` what 7 to 11 share); and the shared
//! helpers: `workloads.rs` and `big.rs` (the programs profiled), `launch.rs` and `process.rs`
//! (running and watching the profilers), `profiles.rs` (reading their output), `records.rs`
//! (what runs leave), `stats.rs` and `report.rs` (figures, tables and the plot).

mod accuracy;
mod agent;
mod asyncio;
mod big;
mod cost;
mod dwarf_overhead;
mod end_of_run;
mod export;
mod kernel_unwind;
mod launch;
mod managed;
mod off_cpu;
mod overhead;
mod own_cost;
mod plan;
mod process;
mod profiles;
mod python;
mod records;
mod report;
mod scale;
mod startup;
mod stats;
mod table_build;
mod unwind;
mod unwind_startup;
mod why;
mod workloads;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use plan::{Plan, TOOLS};
use records::{Overhead, Verdict};
use report::plot;
use stats::stat;
use why::{why, Findings};

/// Options of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// One round at fewer frequencies: a smoke run.
    #[arg(long)]
    pub quick: bool,
}

/// The bench's context: paths, facts about the machine and the bpfprof under test, and what
/// the sections record for the report.
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
    // A developer aid: BPFPROF_BENCH_BIN=PATH measures that bpfprof (a debug build, say)
    // instead of building the release one; its figures are that build's, not to quote.
    let given = std::env::var_os("BPFPROF_BENCH_BIN").map(PathBuf::from);
    if given.is_none() {
        println!("==> building bpfprof (release)");
        crate::cmd::run(crate::cmd::cargo().args(["build", "--release", "-p", "profiler-user"]))?;
    }

    let dir = root.join("target/bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Two benches at once would each measure the other: take turns.
    let lock_path = dir.join(".lock");
    let lock = File::create(&lock_path)?;
    if lock.try_lock().is_err() {
        println!("    waiting for another `cargo xtask bench` to finish");
        lock.lock()?;
    }

    let bpfprof = given.unwrap_or_else(|| root.join("target/release/bpfprof"));
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
    // The report is rewritten whole, so what was measured by hand lives in the notes, and this
    // line keeps them one click away.
    writeln!(
        md,
        "This file is written whole by `cargo xtask bench`: change the bench, not this file. Measurements made by hand beside the bench, and where a section's figures came from when it was run on its own, are in [docs/benchmarks-notes.md](docs/benchmarks-notes.md).\n"
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
    // After each section the report so far goes to BENCHMARKS.progress.md: a run that dies
    // late keeps what it measured.
    let mut progress = Progress::new(&bench);
    let mut t0 = Instant::now();
    if want(1) {
        overhead = bench.overhead(&plan, &mut sections, &mut verdicts)?;
        progress.done(1, &mut t0, &md, &sections, &verdicts)?;
    }
    if want(2) {
        bench.accuracy(&plan, &mut sections, &mut verdicts)?;
        progress.done(2, &mut t0, &md, &sections, &verdicts)?;
    }
    if want(3) {
        bench.startup(&plan, &mut sections, &mut verdicts)?;
        progress.done(3, &mut t0, &md, &sections, &verdicts)?;
    }
    let mut big = BTreeMap::new();
    if want(4) {
        big = bench.end_of_run(&plan, &mut sections, &mut verdicts)?;
        progress.done(4, &mut t0, &md, &sections, &verdicts)?;
    }
    if want(5) {
        bench.own_cost(&plan, &mut sections, &mut verdicts)?;
        progress.done(5, &mut t0, &md, &sections, &verdicts)?;
    }
    if want(6) {
        bench.scale(&plan, &big, &mut sections, &mut verdicts)?;
        progress.done(6, &mut t0, &md, &sections, &verdicts)?;
    }
    // Issues 11 and 12: CFI unwinding and Python frames (kernel_unwind.rs to python.rs); issue
    // 26: off-CPU and wall-clock time; issue 46: the agent on hosts of many processes and a
    // launched run against perf's; issue 44: asyncio tasks; issue 45: Java and Node.js. A
    // section that fails says so in the report instead of losing the whole run's figures.
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
            progress.done(n, &mut t0, &md, &sections, &verdicts)?;
        }
    }
    // Issue 24: the always-on agent; issue 25: what its export costs.
    type AgentSection = fn(&Bench, &Plan, &mut String) -> Result<()>;
    let agent_sections: [(u32, AgentSection); 2] =
        [(12, Bench::agent_cost), (13, Bench::export_size)];
    for (n, section) in agent_sections {
        if want(n) {
            if let Err(e) = section(&bench, &plan, &mut sections) {
                println!("    section {n} failed: {e:#}");
                writeln!(sections, "\n## {n}. (failed in this run: {e:#})\n")?;
            }
            progress.done(n, &mut t0, &md, &sections, &verdicts)?;
        }
    }
    let late_sections: [(u32, Section); 4] = [
        (14, Bench::off_cpu),
        (15, Bench::cost),
        (16, Bench::asyncio),
        (17, Bench::managed),
    ];
    for (n, section) in late_sections {
        if want(n) {
            if let Err(e) = section(&bench, &plan, &mut sections, &mut verdicts) {
                println!("    section {n} failed: {e:#}");
                writeln!(sections, "\n## {n}. (failed in this run: {e:#})\n")?;
            }
            progress.done(n, &mut t0, &md, &sections, &verdicts)?;
        }
    }
    let took = crate::cmd::secs(started.elapsed());
    let md = md.replace(
        "LOAD_AT_END",
        &format!(
            "when it ended: {}. The bench took {took} in all ({}).",
            unwind::load_average(),
            progress.times()
        ),
    );
    let md = bench.report(md, &sections, &verdicts)?;

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
        "==> wrote {} and {} in {took}",
        md_path.display(),
        svg.display(),
    );
    Ok(())
}

impl Bench {
    /// The whole report from its head (`md`): the targets table, the losses, the sections and
    /// the closing "why".
    fn report(&self, mut md: String, sections: &str, verdicts: &[Verdict]) -> Result<String> {
        writeln!(md, "## Targets\n")?;
        writeln!(md, "| target | measured | met |\n|---|---|---|")?;
        for v in verdicts {
            writeln!(
                md,
                "| {} | {} | {} |",
                v.target,
                v.measured,
                if v.met { "yes" } else { "**no**" }
            )?;
        }
        let losses = self.bpfprof_losses.borrow();
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
        md.push_str(sections);
        writeln!(md, "\n## Where bpfprof loses, and why\n")?;
        why(
            &mut md,
            &self.findings.borrow(),
            &losses,
            &self.walker_verify_ms,
        )?;
        Ok(md)
    }
}

/// The sections run so far and their wall times, written after each one to
/// `target/bench/BENCHMARKS.progress.md`.
struct Progress<'a> {
    bench: &'a Bench,
    ran: Vec<(u32, std::time::Duration)>,
}

impl<'a> Progress<'a> {
    fn new(bench: &'a Bench) -> Progress<'a> {
        Progress {
            bench,
            ran: Vec::new(),
        }
    }

    /// Section `n` ended (it started at `t0`, which is reset): prints its wall time and writes
    /// the report so far.
    fn done(
        &mut self,
        n: u32,
        t0: &mut Instant,
        head: &str,
        sections: &str,
        verdicts: &[Verdict],
    ) -> Result<()> {
        let took = t0.elapsed();
        *t0 = Instant::now();
        println!("    section {n} took {}", crate::cmd::secs(took));
        self.ran.push((n, took));
        let head = head.replace(
            "LOAD_AT_END",
            &format!("**in progress**: sections run so far: {}.", self.times()),
        );
        let md = self.bench.report(head, sections, verdicts)?;
        let path = self.bench.dir.join("BENCHMARKS.progress.md");
        fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
    }

    /// Each section run and its wall time: "1 (3m 02s), 2 (1m 10s)".
    fn times(&self) -> String {
        report::join(
            self.ran
                .iter()
                .map(|(n, d)| format!("{n} ({})", crate::cmd::secs(*d))),
            ", ",
        )
    }
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
