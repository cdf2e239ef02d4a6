//! The run summary as JSON, for machines: what was sampled, how, and what was lost.

use std::io::{self, Write};

use serde::Serialize;

use crate::{
    output::top::{function_shares, FunctionShare},
    profile::{
        LateTable, Losses, Profile, ProfiledTarget, RunCost, RunEnd, Tag, Throttled,
        UnavailableObject, UntabledObject, Unwound,
    },
    sampling::{Event, Rate},
};

#[derive(Serialize)]
struct Summary<'a> {
    samples: u64,
    samples_seen: u64,
    event: Event,
    event_fallback: bool,
    period: u64,
    /// Samples per second per busy CPU that the event was set up for (requested, or the
    /// equivalent of the period).
    frequency_hz: f64,
    /// Whether the kernel adjusts the period to hold `frequency_hz` (vs a fixed period).
    frequency_mode: bool,
    effective_hz: f64,
    duration_secs: f64,
    lost: &'a Losses,
    /// Set when the kernel throttled sampling below nine tenths of the requested rate.
    throttled: Option<Throttled>,
    /// How many user stacks each unwinder produced.
    unwind: Unwound,
    /// The objects the targets ran in without an unwind table, most samples first.
    objects_without_unwind_tables: &'a [UntabledObject],
    /// The objects whose table went in during the run after samples had run in them.
    unwind_tables_loaded_late: &'a [LateTable],
    /// What the bounds on reading the targets left out, one sentence per process.
    limits_hit: &'a [String],
    /// The objects that could not be read to name their frames, with why.
    objects_unavailable: &'a [UnavailableObject],
    /// The CPythons whose Python frames bpfprof cannot walk, one sentence each.
    python_unsupported: &'a [String],
    targets: &'a [ProfiledTarget],
    program_id: u32,
    exit: RunEnd,
    tags: &'a [Tag],
    max_stack_length: usize,
    cost: &'a RunCost,
    bpf_ns_per_run: Option<f64>,
    /// Time totals, where the run recorded off-CPU time.
    off_cpu: Option<OffCpuTotals>,
    top_self: Vec<TopEntry>,
}

/// A profile's CPU and off-CPU time, in nanoseconds.
#[derive(Serialize)]
struct OffCpuTotals {
    /// `off-cpu` (blocking waits) or `wall` (waits for a CPU too).
    mode: &'static str,
    /// Shortest interval off the CPU recorded.
    min_ns: u64,
    /// CPU samples times the sampling period.
    cpu_ns: u64,
    /// Time off the CPU, all states.
    off_cpu_ns: u64,
    /// Time off the CPU by state (`sleeping`, `disk`, `preempted`).
    off_cpu_ns_by_state: std::collections::BTreeMap<&'static str, u64>,
    /// Intervals off the CPU recorded.
    off_cpu_intervals: u64,
}

#[derive(Serialize)]
struct TopEntry {
    name: String,
    kernel: bool,
    self_samples: u64,
    total_samples: u64,
}

impl From<FunctionShare> for TopEntry {
    fn from(s: FunctionShare) -> Self {
        TopEntry {
            name: s.name,
            kernel: s.kernel,
            self_samples: s.self_samples,
            total_samples: s.total_samples,
        }
    }
}

/// Samples per second of wall-clock time over the run.
pub fn effective_hz(profile: &Profile) -> f64 {
    let secs = profile.meta.duration.as_secs_f64();
    if secs > 0.0 {
        profile.total_samples() as f64 / secs
    } else {
        0.0
    }
}

/// Writes the summary of `profile` as JSON.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let meta = &profile.meta;
    let summary = Summary {
        samples: profile.total_samples(),
        samples_seen: meta.samples_seen,
        event: meta.sampling.event,
        event_fallback: meta.sampling.fallback,
        period: meta.sampling.period(),
        frequency_hz: meta.sampling.nominal_hz,
        frequency_mode: matches!(meta.sampling.rate, Rate::Frequency(_)),
        effective_hz: effective_hz(profile),
        duration_secs: meta.duration.as_secs_f64(),
        lost: &meta.losses,
        throttled: meta.throttled,
        unwind: meta.unwound,
        objects_without_unwind_tables: &meta.untabled,
        unwind_tables_loaded_late: &meta.tabled_late,
        limits_hit: &meta.limits_hit,
        objects_unavailable: &meta.unavailable,
        python_unsupported: &meta.python_unsupported,
        targets: &meta.targets,
        program_id: meta.program_id,
        exit: meta.end,
        tags: &meta.tags,
        max_stack_length: meta.max_stack_length,
        cost: &meta.cost,
        bpf_ns_per_run: meta.cost.bpf_ns_per_run(),
        off_cpu: meta.off_cpu.map(|settings| {
            let (cpu_ns, by_state) = profile.time_totals();
            OffCpuTotals {
                mode: if settings.preempted {
                    "wall"
                } else {
                    "off-cpu"
                },
                min_ns: settings.min_ns,
                cpu_ns,
                off_cpu_ns: by_state.values().sum(),
                off_cpu_ns_by_state: by_state.iter().map(|(s, ns)| (s.name(), *ns)).collect(),
                off_cpu_intervals: profile
                    .stacks
                    .iter()
                    .filter(|s| profile.off_cpu_state(s).is_some())
                    .map(|s| s.count)
                    .sum(),
            }
        }),
        top_self: function_shares(profile)
            .into_iter()
            .take(20)
            .map(TopEntry::from)
            .collect(),
    };
    serde_json::to_writer_pretty(&mut *w, &summary).map_err(io::Error::other)?;
    writeln!(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;

    #[test]
    fn top_names_are_plain_with_a_kernel_flag() {
        let mut json = Vec::new();
        write(&fixture::profile(), &mut json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let top = v["top_self"].as_array().unwrap();
        let write = top.iter().find(|t| t["name"] == "sys_write").unwrap();
        assert_eq!(write["kernel"], true);
        assert!(!String::from_utf8(json).unwrap().contains("_[k]"));
        assert!(top
            .iter()
            .any(|t| t["name"] == "leaf_hot (app.c:28)" && t["kernel"] == false));
    }
}
