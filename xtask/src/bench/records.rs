//! The records the sections pass around: what a run of a profiler left (its stacks, CPU,
//! memory, summary), the options of an attached run, and a line of the targets table.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::Value;

use super::plan::{Arm, Tool};
use super::process::{BpfStatsGuard, Monitor};

/// Section 1's figures.
#[derive(Default)]
pub(super) struct Overhead {
    /// Seconds of the workload alone, by frequency.
    pub(super) alone: BTreeMap<u64, Vec<f64>>,
    /// Time under each arm / time alone in the same round.
    pub(super) ratios: BTreeMap<(Arm, u64), Vec<f64>>,
}

/// Folded stacks, `root;...;leaf` without the process name, to sample counts.
pub(super) type Stacks = BTreeMap<String, u64>;

/// CPU time of a process and the children it reaped (from `wait4`), and its memory (from
/// `/proc/PID/status`, see [`Monitor`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Usage {
    pub(super) cpu_secs: f64,
    pub(super) max_rss_kib: f64,
    /// RSS at the last look before the process exited.
    pub(super) last_rss_kib: f64,
}

/// The cost of turning perf's data into stacks: `perf script`, then folding its text.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PostCost {
    pub(super) secs: f64,
    pub(super) usage: Usage,
}

/// What a profiler left behind after an attached run.
pub(super) struct Attached {
    pub(super) stacks: Stacks,
    /// The profiler process over its whole life.
    pub(super) usage: Usage,
    /// From SIGINT to the profiler's exit, its profile written.
    pub(super) stop_secs: f64,
    /// perf only: `perf script` and folding.
    pub(super) post: Option<PostCost>,
    /// bpfprof only: its `--summary-json`.
    pub(super) summary: Option<Value>,
    /// Samples the profiler saw but did not keep, when it can tell (see [`drops`]).
    pub(super) drops: Option<u64>,
    /// Samples the profiler's kernel side saw (bpftrace's `@n` counter), when counted.
    pub(super) fired: Option<u64>,
    /// bpftrace only, with BPF statistics on: (run time ns, run count) of its program.
    pub(super) bpf_stats: Option<(u64, u64)>,
    /// Seconds between the first and last sample (perf only).
    pub(super) span_secs: Option<f64>,
    /// CPUs the target kept busy, on average, while the profiler ran.
    pub(super) target_cpus: Option<f64>,
}

/// What one launched command (a profiler with its workload, or the workload alone) left.
pub(super) struct Launched {
    /// The workload's stdout lines.
    pub(super) lines: Vec<String>,
    /// CLOCK_MONOTONIC just before the command was spawned.
    pub(super) spawned_ns: u64,
    pub(super) stacks: Stacks,
}

impl Launched {
    /// The value of the workload's `KEY VALUE` line.
    pub(super) fn value(&self, key: &str) -> Result<f64> {
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
pub(super) struct AttachOpts {
    /// bpftrace: also count every sample its probe fires for (`@n`), to count its drops.
    pub(super) count_fired: bool,
    /// Measure the kernel program's run time (bpfprof `--bpf-stats`; for bpftrace, BPF
    /// statistics are turned on around the run).
    pub(super) bpf_stats: bool,
    /// bpftrace: exit on its own after this many seconds (gives it a known duration).
    pub(super) bpftrace_exit_after: Option<u64>,
}

/// An attached profiler, running.
pub(super) struct Running {
    pub(super) tool: Tool,
    pub(super) child: Child,
    pub(super) monitor: Monitor,
    /// The target and its CPU time when the profiler started.
    pub(super) target: (i32, Option<f64>, Instant),
    pub(super) out: PathBuf,
    pub(super) stderr: PathBuf,
    pub(super) opts: AttachOpts,
    pub(super) stats_guard: Option<BpfStatsGuard>,
}

/// One line of the targets table.
pub(super) struct Verdict {
    pub(super) target: String,
    pub(super) measured: String,
    pub(super) met: bool,
}
