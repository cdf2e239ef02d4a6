//! Section 4: from the stop signal to the written profile, on the generated large binary with
//! many unique stacks.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;

use anyhow::Result;

use super::plan::{Plan, Tool, ATTACH_SECS, BIG_LEVELS, BIG_PER_LEVEL, TOOLS_COMPARED};
use super::process::stop_target;
use super::profiles::frames_of;
use super::records::{AttachOpts, Attached, Verdict};
use super::stats::{median, rotate, stat};
use super::why::{end_secs, peak_rss_mib};
use super::Bench;

impl Bench {
    /// Section 4: from stop to the written profile, on a large binary with many unique
    /// stacks.
    pub(super) fn end_of_run(
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
        let med_of = |tool: Tool, g: &dyn Fn(&Attached) -> f64| {
            median(&runs[&tool].iter().map(g).collect::<Vec<_>>())
        };
        let (stop, unique) = (
            med_of(Tool::Bpfprof, &|a| a.stop_secs),
            med_of(Tool::Bpfprof, &|a| a.stacks.len() as f64),
        );
        verdicts.push(Verdict {
            target: "end of run under 0.5 s, many unique stacks (section 4; issue 28)".into(),
            measured: format!("{stop:.2} s at {unique:.0} unique stacks (medians)"),
            met: stop < 0.5,
        });
        let (rss, perf_rss) = (
            med_of(Tool::Bpfprof, &peak_rss_mib),
            med_of(Tool::Perf, &peak_rss_mib),
        );
        verdicts.push(Verdict {
            target: "peak RSS at most perf record's, many unique stacks (section 4; issue 28)"
                .into(),
            measured: format!("bpfprof {rss:.1} MiB, perf {perf_rss:.1} MiB (medians)"),
            met: rss <= perf_rss,
        });
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
}
