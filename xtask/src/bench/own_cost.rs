//! Section 5: the profilers' own CPU and memory, and the per-sample cost of their BPF programs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::plan::{Plan, Tool, ATTACH_SECS, TOOLS_COMPARED};
use super::process::stop_target;
use super::records::{AttachOpts, Attached, Verdict};
use super::stats::{median, rotate, stat};
use super::Bench;

impl Bench {
    /// Section 5: the profilers' own CPU and memory, and the per-sample cost of the BPF
    /// programs.
    pub(super) fn own_cost(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
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
        for &hz in &plan.own_cost_hz {
            let rss = |tool| {
                median(
                    &runs[&(tool, hz)]
                        .iter()
                        .map(|a| a.usage.max_rss_kib / 1024.0)
                        .collect::<Vec<_>>(),
                )
            };
            let (b, p) = (rss(Tool::Bpfprof), rss(Tool::Perf));
            verdicts.push(Verdict {
                target: format!("peak RSS at most perf record's, {hz} Hz (section 5; issue 28)"),
                measured: format!("bpfprof {b:.1} MiB, perf {p:.1} MiB (medians)"),
                met: b <= p,
            });
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
}
