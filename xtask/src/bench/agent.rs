//! Section 12: the always-on agent's own cost (`bpfprof agent`, system-wide) at 19 and 99 Hz,
//! on the machine as it is and with every core busy, beside `perf record -a -g -F 19` over the
//! same interval.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::plan::{Plan, AGENT_HZ, AGENT_SETTLE_SECS};
use super::process::{proc_cpu_secs, signal, stop_target};
use super::Bench;

/// A profiler's CPU share of one core over the measured interval and its memory at the end.
pub(super) struct Cost {
    pub(super) percent_of_core: f64,
    pub(super) rss_mib: f64,
    pub(super) peak_rss_mib: f64,
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

impl Bench {
    /// Runs `argv` for the settling time and then `secs`, measuring the interval after it
    /// settled (start-up, the walker's verification, is not the always-on cost).
    pub(super) fn always_on_cost(&self, argv: &[&str], secs: f64) -> Result<Cost> {
        let mut child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {argv:?}"))?;
        let pid = child.id();
        std::thread::sleep(Duration::from_secs_f64(AGENT_SETTLE_SECS));
        let before = proc_cpu_secs(pid as i32).context("the profiler exited early")?;
        std::thread::sleep(Duration::from_secs_f64(secs));
        let after = proc_cpu_secs(pid as i32).context("the profiler exited early")?;
        let (rss, peak) = rss_mib(pid);
        signal(&child, libc::SIGINT);
        let _ = child.wait();
        Ok(Cost {
            percent_of_core: 100.0 * (after - before) / secs,
            rss_mib: rss,
            peak_rss_mib: peak,
        })
    }

    /// Section 12: the agent's own CPU and memory, idle and busy, beside perf's.
    pub(super) fn agent_cost(&self, plan: &Plan, md: &mut String) -> Result<()> {
        println!("==> 12. the agent's own cost");
        let secs = if plan.quick { 10.0 } else { 30.0 };
        let bpfprof = self.bpfprof.display().to_string();
        let perf_data = self.dir.join("agent-perf.data").display().to_string();
        let mut rows = Vec::new();
        for busy in [false, true] {
            let mut load = if busy {
                Some(self.spawn_target("burn", &["0", &self.cpus.to_string()])?)
            } else {
                None
            };
            let measured = (|| -> Result<()> {
                for hz in AGENT_HZ {
                    let f = hz.to_string();
                    let cost = self.always_on_cost(&[&bpfprof, "agent", "-F", &f], secs)?;
                    rows.push((format!("bpfprof agent -F {hz}"), busy, cost));
                }
                let argv = [
                    "perf", "record", "-a", "-g", "-F", "19", "-q", "-o", &perf_data,
                ];
                let cost = self.always_on_cost(&argv, secs)?;
                rows.push(("perf record -a -g -F 19".to_string(), busy, cost));
                Ok(())
            })();
            if let Some(load) = load.as_mut() {
                stop_target(load);
            }
            measured?;
        }
        let _ = std::fs::remove_file(&perf_data);
        writeln!(md, "\n## 12. The agent's own cost\n")?;
        writeln!(md, "`bpfprof agent` (system-wide, 10 s windows, no listener) and `perf record -a -g -F 19`, each alone, measured over {secs} s after {AGENT_SETTLE_SECS} s of start-up, on the machine as it was (other work included: it is shared) and with `bench/burn.c` keeping every core busy. CPU: user + system time of the profiler's process over the interval, as a share of one core; memory: its RSS at the end and its peak. perf's figure is `perf record` alone: it writes raw stacks, which `perf script` and folding must still read.\n")?;
        writeln!(md, "| profiler | load | CPU, % of one core | RSS, MiB | peak RSS, MiB |\n|---|---|---|---|---|")?;
        for (name, busy, cost) in &rows {
            writeln!(
                md,
                "| {name} | {} | {:.2} | {:.1} | {:.1} |",
                if *busy { "every core busy" } else { "as is" },
                cost.percent_of_core,
                cost.rss_mib,
                cost.peak_rss_mib
            )?;
        }
        Ok(())
    }
}
