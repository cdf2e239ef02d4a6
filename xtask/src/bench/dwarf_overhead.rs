//! Section 10: overhead of CFI unwinding next to `perf record --call-graph dwarf`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::process::Command;

use anyhow::Result;

use super::plan::{Plan, BURN_ITERS};
use super::profiles::perf_stacks;
use super::records::{Stacks, Verdict};
use super::stats::{median, rotate, stat};
use super::unwind::{bytes_of, share_with};
use super::Bench;

impl Bench {
    /// Section 10: overhead at 999 Hz on a workload without frame pointers, bpfprof's CFI walk
    /// next to `perf record --call-graph dwarf` (and perf's frame-pointer walk).
    pub(super) fn dwarf_overhead(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 10. overhead against perf --call-graph dwarf");
        self.compile_unwind_workloads()?;
        let hz = "999";
        let argv = self.workload("burn-nofp", &[BURN_ITERS, &self.cpus.to_string()]);
        let arms = [
            "alone",
            "bpfprof --unwind cfi",
            "perf record --call-graph dwarf",
            "perf record -g",
        ];
        let perf_data = self.dir.join("dwarf.perf");
        let bpf_out = [self.dir.join("u.folded"), self.dir.join("u.json")];
        let mut slowdown: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut bytes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut full: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        // bpfprof's own CPU seconds over each run (its summary), and the workload's time alone.
        let mut own_cpu = Vec::new();
        let mut alone_secs = Vec::new();
        self.timed({
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        })?; // warm-up
        for round in 0..plan.overhead_rounds() {
            let mut order: Vec<&str> = arms.to_vec();
            rotate(&mut order, round);
            let mut secs = BTreeMap::new();
            for arm in order {
                let _ = fs::remove_file(&perf_data);
                let cmd = match arm {
                    "alone" => {
                        let mut c = Command::new(&argv[0]);
                        c.args(&argv[1..]);
                        c
                    }
                    "bpfprof --unwind cfi" => {
                        let mut c = self.bpfprof_cmd(&["-F", hz, "--unwind", "cfi", "--"]);
                        c.args(&argv);
                        c
                    }
                    _ => {
                        let mut c = Command::new("perf");
                        c.args(["record", "-q", "-e", "cpu-clock", "-F", hz]);
                        if arm.contains("dwarf") {
                            c.args(["--call-graph", "dwarf"]);
                        } else {
                            c.arg("-g");
                        }
                        c.arg("-o").arg(&perf_data).arg("--").args(&argv);
                        c
                    }
                };
                let s = self.timed(cmd)?.value("secs")?;
                println!("    round {round}: {arm} {s:.3}s");
                secs.insert(arm, s);
                // Written bytes and the share of stacks that reach the thread's root
                // (`worker`, below `start_thread`): the stacks were walked right.
                let (written, stacks) = match arm {
                    "alone" => continue,
                    "bpfprof --unwind cfi" => {
                        let (stacks, summary) = self.bpfprof_result()?;
                        own_cpu.push(summary["cost"]["profiler_cpu_secs"].as_f64().unwrap_or(0.0));
                        (bytes_of(&bpf_out), stacks)
                    }
                    _ => (
                        bytes_of(std::slice::from_ref(&perf_data)),
                        perf_stacks(&perf_data)?.0,
                    ),
                };
                bytes.entry(arm).or_default().push(written as f64);
                let leaf = |s: &Stacks| {
                    s.iter()
                        .filter(|(k, _)| k.contains("burn_leaf"))
                        .map(|(_, n)| *n)
                        .sum::<u64>()
                };
                let whole: Stacks = stacks
                    .iter()
                    .filter(|(k, _)| k.contains("burn_leaf"))
                    .map(|(k, n)| (k.clone(), *n))
                    .collect();
                let pct = share_with(&whole, "worker");
                println!("        {written} bytes written, {pct:.1}% of {} burn_leaf samples reach `worker`", leaf(&stacks));
                full.entry(arm).or_default().push(pct);
            }
            let alone = secs["alone"];
            alone_secs.push(alone);
            for (arm, s) in secs {
                if arm != "alone" {
                    slowdown.entry(arm).or_default().push(s / alone);
                }
            }
        }
        writeln!(
            md,
            "\n## 10. Overhead against `perf record --call-graph dwarf`\n"
        )?;
        writeln!(md, "`bench/burn.c` built without frame pointers (`burn-nofp`: {BURN_ITERS} multiply-adds per thread, one thread per core, a dozen frames deep), launched under each profiler at {hz} Hz. `--call-graph dwarf` is the perf mode that gives the same stacks as bpfprof's CFI walk: it copies 8 KiB of user stack per sample into `perf.data` and unwinds after the run; `perf record -g` (frame pointers) is shown for its cost, not its stacks, which on this build are wrong. Slowdown = time under the profiler / time alone in the same round; bytes written: bpfprof's profile and summary, perf's `perf.data`; whole stacks: share of the samples in `burn_leaf` whose stack reaches the thread's function `worker` (for perf after `perf script`). Median (min–max) over {} rounds, arms in a rotated order.\n", plan.overhead_rounds())?;
        writeln!(md, "| profiler | slowdown | bytes written | `burn_leaf` samples with the whole stack, % |\n|---|---|---|---|")?;
        for arm in &arms[1..] {
            writeln!(
                md,
                "| {arm} | {} | {} | {} |",
                stat(&slowdown[arm], 3),
                stat(&bytes[arm], 0),
                stat(&full[arm], 1)
            )?;
        }
        let b = median(&slowdown["bpfprof --unwind cfi"]) - 1.0;
        let p = median(&slowdown["perf record --call-graph dwarf"]) - 1.0;
        // Where bpfprof's slowdown comes from: its own CPU, taken from a workload that keeps
        // every core busy, against the CPU the workload itself needs.
        let work_cpu = median(&alone_secs) * self.cpus as f64;
        writeln!(md, "\nbpfprof's own CPU over a run: {} s (median (min–max)), against {work_cpu:.2} CPU-s of work (every core busy for {:.2} s): {:.1}% of it, {} its added time ({:+.1}%). Of that, {} ms (`bpfprof doctor`'s measure at the start of this bench) is the kernel verifying the CFI/Python walker program once per bpfprof process (the daemon verifies it once for a series of runs), done before the command starts (it waits at its exec), the rest its unwind tables (read from the table cache after the first run), stack moves and symbolization. perf copies stacks during the run and unwinds them after it (`perf report`, `perf script`), outside the timed work.", stat(&own_cpu, 2), median(&alone_secs), 100.0 * median(&own_cpu) / work_cpu, if median(&own_cpu) / work_cpu >= 0.5 * b { "against" } else { "a part of" }, b * 100.0, self.walker_verify_ms)?;
        let (bb, pb) = (
            median(&bytes["bpfprof --unwind cfi"]),
            median(&bytes["perf record --call-graph dwarf"]),
        );
        verdicts.push(Verdict {
            target: "overhead below `perf --call-graph dwarf` at 999 Hz, no frame pointers".into(),
            measured: format!(
                "bpfprof {:+.1}%, perf dwarf {:+.1}%; bytes written {:.0} KiB against {:.0} KiB",
                b * 100.0,
                p * 100.0,
                bb / 1024.0,
                pb / 1024.0
            ),
            met: b < p && bb < pb,
        });
        Ok(())
    }
}
