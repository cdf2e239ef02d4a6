//! Section 7: the kernel program's time per target sample, CFI walks against frame-pointer
//! walks, at two stack depths.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use super::plan::{Plan, ATTACH_SECS, KERNEL_DEPTHS, NOFP_CFLAGS};
use super::process::stop_target;
use super::records::Verdict;
use super::stats::{median, rotate, stat};
use super::Bench;

impl Bench {
    /// Section 7: kernel program time per target sample, CFI against frame pointers.
    pub(super) fn kernel_unwind(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 7. kernel program time per sample, CFI vs frame pointers");
        self.compile_unwind_workloads()?;
        let secs = if plan.quick { 1.0 } else { ATTACH_SECS };
        // (row, workload, --unwind)
        let rows = [
            (
                "frame pointers: `--unwind fp`, built with frame pointers",
                "burn",
                "fp",
            ),
            (
                "CFI: `--unwind cfi`, built without frame pointers",
                "burn-nofp",
                "cfi",
            ),
            (
                "CFI on the frame-pointer build: `--unwind cfi`",
                "burn",
                "cfi",
            ),
        ];
        let mut per_sample: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
        let mut frames: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
        let mut reject: Vec<f64> = Vec::new();
        // Target samples as a share of the program's runs: how much the correction weighs.
        let mut share: Vec<f64> = Vec::new();
        let mut idle = Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::null())
            .spawn()
            .context("starting sleep")?;
        let result = (|| -> Result<()> {
            for &depth in &KERNEL_DEPTHS {
                let depth_s = depth.to_string();
                let cpus = self.cpus.to_string();
                for round in 0..plan.rounds {
                    let mut order: Vec<usize> = (0..rows.len()).collect();
                    rotate(&mut order, round);
                    for i in order {
                        let (_, name, mode) = rows[i];
                        // Only the measured workload runs, so that its threads are on the
                        // CPUs as much as the machine's other work lets them.
                        let mut target = self.spawn_target(name, &["0", &cpus, &depth_s])?;
                        let run = (|| -> Result<()> {
                            // The reject cost, with this workload keeping the CPUs busy: the
                            // program runs on the same samples but none matches (the target is
                            // an idle process).
                            let floor =
                                self.kernel_run(idle.id() as i32, &["--unwind", mode], secs)?;
                            let r = floor.run_time_ns / floor.run_count.max(1.0);
                            reject.push(r);
                            let k =
                                self.kernel_run(target.id() as i32, &["--unwind", mode], secs)?;
                            let other = (k.run_count - k.target_samples).max(0.0);
                            let ns = (k.run_time_ns - other * r) / k.target_samples.max(1.0);
                            println!(
                                "    depth {depth} {name} --unwind {mode}: {ns:.0} ns per target sample ({} of {} runs on the target, {:.1} frames; reject {r:.0} ns)",
                                k.target_samples, k.run_count, k.frames
                            );
                            per_sample.entry((i, depth)).or_default().push(ns);
                            frames.entry((i, depth)).or_default().push(k.frames);
                            share.push(100.0 * k.target_samples / k.run_count.max(1.0));
                            Ok(())
                        })();
                        stop_target(&mut target);
                        run?;
                    }
                }
            }
            Ok(())
        })();
        stop_target(&mut idle);
        result?;

        writeln!(
            md,
            "\n## 7. Kernel program time per sample: CFI against frame pointers\n"
        )?;
        writeln!(md, "`bench/burn.c` recursing {} and {} levels deep (`descend`; the stacks hold about 5 more frames: the leaf, `keep_frame`'s caller chain, `worker`, `start_thread`, `clone3`), one thread per core, running until killed, built twice: with frame pointers (the bench's usual flags) and without (`{}`: gcc's default `.eh_frame` CFI, as distro binaries are built). bpfprof attaches for {secs} s at 999 Hz with `--bpf-stats`; `kernel.bpf_stats_enabled` gives the program's total run time T and run count N, and the summary the samples of the target S. The program also runs, and rejects, every sample of other processes (idle CPUs, the machine's other work), so each round first measures the reject cost r: bpfprof watching an idle `sleep` while the same workload keeps both CPUs busy (T/N of that run, every sample rejected). The cost per target sample is (T − (N − S)·r) / S. Each arm's workload runs alone (one at a time), and the reject run is taken with that workload running. On this shared machine the target's samples were {} % of the program's runs (median (min–max)): the rest are the other engineers' processes and idle CPUs. Median (min–max) over {} rounds, the three arms of a round in a rotated order; frames per stack (mean over samples) shows the walk reached the full depth. The reject cost row is over all arms.\n", KERNEL_DEPTHS[0], KERNEL_DEPTHS[1], NOFP_CFLAGS.join(" "), stat(&share, 0), plan.rounds)?;
        writeln!(md, "| walk | depth {0}: ns per target sample | depth {0}: frames | depth {1}: ns per target sample | depth {1}: frames |\n|---|---|---|---|---|", KERNEL_DEPTHS[0], KERNEL_DEPTHS[1])?;
        for (i, (row, _, _)) in rows.iter().enumerate() {
            let cell = |d: usize, digits| {
                per_sample
                    .get(&(i, d))
                    .map_or("n/a".into(), |v| stat(v, digits))
            };
            let fr = |d: usize| frames.get(&(i, d)).map_or("n/a".into(), |v| stat(v, 1));
            writeln!(
                md,
                "| {row} | {} | {} | {} | {} |",
                cell(KERNEL_DEPTHS[0], 0),
                fr(KERNEL_DEPTHS[0]),
                cell(KERNEL_DEPTHS[1], 0),
                fr(KERNEL_DEPTHS[1])
            )?;
        }
        writeln!(
            md,
            "| reject cost r (no target sample), ns per run | {} | | | |",
            stat(&reject, 0)
        )?;
        let med = |i: usize, d: usize| per_sample.get(&(i, d)).map_or(f64::NAN, |v| median(v));
        let (fp12, cfi12) = (med(0, KERNEL_DEPTHS[0]), med(1, KERNEL_DEPTHS[0]));
        let ratio = cfi12 / fp12;
        writeln!(
            md,
            "\nCFI / frame pointers, medians: depth {}: {:.2}; depth {}: {:.2}.",
            KERNEL_DEPTHS[0],
            ratio,
            KERNEL_DEPTHS[1],
            med(1, KERNEL_DEPTHS[1]) / med(0, KERNEL_DEPTHS[1])
        )?;
        // The cost of one more frame: the difference between the depths over the difference
        // in frames, which leaves out what a sample costs whatever its depth.
        let per_frame = |i: usize| {
            let f = |d: usize| frames.get(&(i, d)).map_or(f64::NAN, |v| median(v));
            (med(i, KERNEL_DEPTHS[1]) - med(i, KERNEL_DEPTHS[0]))
                / (f(KERNEL_DEPTHS[1]) - f(KERNEL_DEPTHS[0]))
        };
        writeln!(md, "\nOne more frame costs {:.0} ns by CFI and {:.0} ns by frame pointers (medians; the difference between the two depths over the difference in frames). A CFI frame is a binary search of the object's table (in a BPF array, each step a bounds-checked map access; a search of the process's mappings too when the frame leaves the previous frame's object) and the CFA rule applied; its return address and saved rbp come from a 512-byte window of stack that one user read (a helper call) fills for all the frames it holds, 32 of `descend`'s 16-byte frames. A frame-pointer frame is the kernel's own loop of one user read. At {} frames that is {:.1} µs against {:.1} µs.", per_frame(1), per_frame(0), KERNEL_DEPTHS[1], med(1, KERNEL_DEPTHS[1]) / 1e3, med(0, KERNEL_DEPTHS[1]) / 1e3)?;
        verdicts.push(Verdict {
            target: format!(
                "kernel CFI walk at most 2x the frame-pointer walk, {} frames deep",
                KERNEL_DEPTHS[0]
            ),
            measured: format!(
                "{ratio:.2}x ({cfi12:.0} ns against {fp12:.0} ns per target sample, medians)"
            ),
            met: ratio <= 2.0,
        });
        let cfi120 = med(1, KERNEL_DEPTHS[1]);
        let ratio120 = cfi120 / med(0, KERNEL_DEPTHS[1]);
        verdicts.push(Verdict {
            target: format!(
                "kernel CFI walk at most 1.3x the frame-pointer walk, {} frames deep (issue 28)",
                KERNEL_DEPTHS[1]
            ),
            measured: format!("{ratio120:.2}x (medians)"),
            met: ratio120 <= 1.3,
        });
        verdicts.push(Verdict {
            target: format!(
                "kernel CFI walk under 10 µs per sample, {} frames deep",
                KERNEL_DEPTHS[1]
            ),
            measured: format!("{:.1} µs (median)", cfi120 / 1e3),
            met: cfi120 < 10_000.0,
        });
        Ok(())
    }
}
