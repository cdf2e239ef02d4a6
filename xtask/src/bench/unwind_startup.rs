//! Section 9: start-up with each `--unwind` mode.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

use anyhow::Result;

use super::plan::{Plan, SHORT_ITERS};
use super::profiles::first_sample_ns;
use super::records::Verdict;
use super::stats::{median, stat};
use super::Bench;

impl Bench {
    /// Section 9: start-up with each `--unwind` mode, and a 10 ms command under bpfprof.
    pub(super) fn unwind_startup(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 9. start-up by unwind mode");
        self.compile_unwind_workloads()?;
        let rounds = plan.rounds.max(if plan.quick { 1 } else { 3 });
        let modes = ["fp", "auto"];
        let mut first: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut short: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let short_argv = self.workload("burn-nofp", &[SHORT_ITERS, "1"]);
        for _ in 0..rounds {
            for mode in modes {
                let mut cmd = self.bpfprof_cmd(&["-F", "999", "--unwind", mode, "--"]);
                cmd.args(self.startup_argv());
                let run = self.timed(cmd)?;
                let (stacks, _) = self.bpfprof_result()?;
                let start = run.value("start")? as u64;
                let ms = first_sample_ns(&stacks, start)
                    .map_or(f64::NAN, |t| (t as f64 - run.spawned_ns as f64) / 1e6);
                println!("    --unwind {mode}: first sample after {ms:.1} ms");
                first.entry(mode).or_default().push(ms);
            }
            let mut bare = Command::new(&short_argv[0]);
            bare.args(&short_argv[1..]);
            let t = self.timed(bare)?.wall_secs * 1e3;
            println!("    10 ms command alone: {t:.1} ms");
            short.entry("alone").or_default().push(t);
            for mode in modes {
                let mut cmd = self.bpfprof_cmd(&["-F", "999", "--unwind", mode, "--"]);
                cmd.args(&short_argv);
                let t = self.timed(cmd)?.wall_secs * 1e3;
                println!("    10 ms command under --unwind {mode}: {t:.1} ms");
                short.entry(mode).or_default().push(t);
            }
        }
        writeln!(md, "\n## 9. Start-up by unwind mode\n")?;
        writeln!(md, "First sample: as in section 3 (`bench/startup.c` under `bpfprof -F 999 --unwind MODE -- CMD`, from spawning bpfprof to the first sampled `slot_k`). Short command: `burn-nofp {SHORT_ITERS} 1` (about 10 ms of work on one thread, built without frame pointers, so `auto` has CFI tables to load for it and libc) alone and under `bpfprof -F 999 --unwind MODE --`, wall time from spawn to exit with the profile written. Median (min–max) over {rounds} rounds, in ms.\n")?;
        writeln!(
            md,
            "| | to first sample, ms | 10 ms command, total wall ms |\n|---|---|---|"
        )?;
        writeln!(md, "| alone | | {} |", stat(&short["alone"], 1))?;
        for mode in modes {
            writeln!(
                md,
                "| bpfprof --unwind {mode} | {} | {} |",
                stat(&first[mode], 1),
                stat(&short[mode], 1)
            )?;
        }
        for mode in modes {
            let ms = median(&first[mode]);
            verdicts.push(Verdict {
                target: format!("first sample of a small process under 100 ms (`--unwind {mode}`)"),
                measured: format!(
                    "{ms:.1} ms (median); a 10 ms command takes {:.0} ms in all (alone {:.0} ms)",
                    median(&short[mode]),
                    median(&short["alone"])
                ),
                met: ms < 100.0,
            });
        }
        Ok(())
    }
}
