//! Section 6: samples per second without drops as the frequency rises, and memory as the number
//! of unique stacks grows.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::plan::{Plan, Tool, ATTACH_SECS, TOOLS_COMPARED};
use super::process::stop_target;
use super::records::{AttachOpts, Attached, Verdict};
use super::why::{end_secs, peak_rss_mib};
use super::Bench;

impl Bench {
    /// Section 6: samples per second without drops as the frequency rises, and memory as the
    /// number of unique stacks grows.
    pub(super) fn scale(
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
