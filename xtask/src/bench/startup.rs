//! Section 3: start-up latency, from the command's start to the first sample (CLI, attach and
//! daemon).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::plan::{Plan, Tool};
use super::profiles::first_sample_ns;
use super::records::Verdict;
use super::stats::{median, stat};
use super::Bench;

impl Bench {
    /// Section 3: from the command's start to the first sample.
    pub(super) fn startup(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
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
        writeln!(md, "From the moment the bench starts the command to the profiler's first sample of the target, at {hz} Hz; median (min–max) over {rounds} rounds, in ms. `bench/startup.c` prints its start time (CLOCK_MONOTONIC, the clock the bench reads before spawning the command) and then spends millisecond k in function `slot_k`: the first slot in the profile dates the first sample to within a millisecond (taken as the slot's middle). Launch mode starts the workload under the profiler; attach mode starts the profiler against the workload already running. For the daemon, `run` returns once the run is RUNNING; the time to that is shown too (client start-up included). By design, `bpfprof --pid` and a daemon run on a freshly loaded program wait for the kernel to verify the CFI/Python walker program ({} ms here, measured by `bpfprof doctor` at the start of this bench) before their first sample, so that every stack they record is walked whole, and a launched command is held at its exec for that long (it then runs without the verification beside it); the daemon keeps its program loaded for 30 s after a run, so its next runs start without the wait.\n", self.walker_verify_ms)?;
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
}
