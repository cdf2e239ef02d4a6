//! The text summary of a recording: samples, rate, tags, own cost, throttling, how stacks were
//! walked, losses and the top functions.

use crate::{
    output::{summary::effective_hz, top},
    profile::{CostScope, Profile, ShortfallCause},
};

/// Most processes the summary's first line names one by one; more are counted.
const SUMMARY_PROCESSES: usize = 8;

/// A kernel sysctl's value, `?` when unreadable.
fn read_sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The text summary a recording prints on stderr when it ends.
pub fn summary(profile: &Profile) -> String {
    let meta = &profile.meta;
    let targets: Vec<String> = meta
        .targets
        .iter()
        .map(|t| format!("pid {} ({})", t.pid, t.comm))
        .collect();
    // A system-wide run's processes are in the profile's roots, not on one line.
    let from = if targets.len() > SUMMARY_PROCESSES {
        format!("{} processes", targets.len())
    } else {
        targets.join(", ")
    };
    let mut out = format!(
        "bpfprof: {} samples in {:.2}s from {} with {}\n  effective rate: {:.1} samples/s\n",
        profile.total_samples(),
        meta.duration.as_secs_f64(),
        from,
        meta.sampling.describe(),
        effective_hz(profile),
    );
    if !meta.tags.is_empty() {
        out.push_str(&format!("  tags: {}\n", meta.tag_list(", ")));
    }
    let cost = &meta.cost;
    let mib = cost.profiler_peak_rss_bytes as f64 / (1024.0 * 1024.0);
    out.push_str(&match cost.scope {
        CostScope::Process => format!(
            "  bpfprof itself: {:.2}s CPU, {mib:.1} MiB peak memory",
            cost.profiler_cpu_secs
        ),
        CostScope::DaemonRun => format!(
            "  bpfprof daemon: {:.2}s CPU on this run, {mib:.1} MiB daemon peak memory (all runs)",
            cost.profiler_cpu_secs
        ),
    });
    if let Some(ns) = cost.bpf_ns_per_run() {
        out.push_str(&format!("; kernel program {ns:.0} ns per run"));
    }
    if let (Some(t), Some(n)) = (cost.off_cpu_bpf_run_time_ns, cost.off_cpu_bpf_run_count) {
        out.push_str(&format!(
            "; off-CPU program {:.0} ns per context switch ({n} switches)",
            t as f64 / n.max(1) as f64
        ));
    }
    out.push('\n');
    match meta.throttled {
        Some(t) if t.cause == ShortfallCause::KernelThrottling => out.push_str(&format!(
            "  throttled by the kernel: {:.0}% of the {} samples asked for (all CPUs) were \
             taken (kernel.perf_event_max_sample_rate {}, kernel.perf_cpu_time_max_percent {}); \
             ask for a lower rate\n",
            100.0 * t.taken_share(),
            t.expected_samples,
            read_sysctl("perf_event_max_sample_rate"),
            read_sysctl("perf_cpu_time_max_percent"),
        )),
        Some(t) => out.push_str(&format!(
            "  sampling fell short: {:.0}% of the {} samples asked for (all CPUs) were taken, \
             well below the kernel's limits: timer interrupts came late (a loaded machine, or \
             a VM waiting for its host)\n",
            100.0 * t.taken_share(),
            t.expected_samples,
        )),
        None => {}
    }
    let unwound = meta.unwound;
    if unwound.cfi_stacks > 0 {
        out.push_str(&format!(
            "  user stacks: {} walked by the CFI walker ({} frames of them by frame pointer and \
             {} by stack scanning, where no table covered the code), {} by frame pointers alone\n",
            unwound.cfi_stacks,
            unwound.frame_pointer_frames_in_cfi_stacks,
            unwound.scanned_frames_in_cfi_stacks,
            unwound.frame_pointer_stacks
        ));
    }
    if unwound.stacks_through_untabled > 0 {
        let mut named = String::new();
        let largest: Vec<String> = meta
            .untabled
            .iter()
            .take(3)
            .map(|o| format!("{} ({} samples: {})", o.name, o.samples, o.why))
            .collect();
        if !largest.is_empty() {
            named.push_str(&format!("; without a table: {}", largest.join("; ")));
        }
        let late: Vec<String> = meta
            .tabled_late
            .iter()
            .take(3)
            .map(|t| format!("{} ({:.2} s in)", t.name, t.after_secs))
            .collect();
        if !late.is_empty() {
            named.push_str(&format!(
                "; tables loaded during the run: {}",
                late.join(", ")
            ));
        }
        out.push_str(&format!(
            "  {} stacks had frames that no unwind table covered, walked there by frame \
             pointer or a stack scan (code without CFI, such as JIT code, or an object whose \
             table was not loaded yet){named}\n",
            unwound.stacks_through_untabled,
        ));
    }
    for limit in &meta.limits_hit {
        out.push_str(&format!("  partly read: {limit}\n"));
    }
    for object in &meta.unavailable {
        // A path its user chose.
        out.push_str(&format!(
            "  Unavailable: {}: {} (its frames are named module+0xOFFSET)\n",
            crate::cli::terminal::escape(&object.name),
            object.why
        ));
    }
    for said in &meta.python_unsupported {
        // It names the process, whose name its owner chose.
        out.push_str(&format!("  {}\n", crate::cli::terminal::escape(said)));
    }
    if cost.unwind_tables_built > 0 {
        out.push_str(&format!(
            "  unwind tables: {} built{} ({:.1} MiB, {:.0} ms on the build thread), {:.1} of {:.0} \
             MiB of kernel memory in use\n",
            cost.unwind_tables_built,
            match cost.unwind_tables_cached {
                0 => String::new(),
                n => format!(", {n} of them read from the cache"),
            },
            (cost.unwind_rows_built * 8) as f64 / (1024.0 * 1024.0),
            cost.unwind_build_secs * 1e3,
            cost.unwind_resident_bytes as f64 / (1024.0 * 1024.0),
            cost.unwind_array_bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    if unwound.before_walker_ready > 0 {
        out.push_str(&format!(
            "  {} stacks were taken by frame pointers while the CFI walker was still loading\n",
            unwound.before_walker_ready
        ));
    }
    if unwound.python_stacks + unwound.python_stacks_missing > 0 {
        out.push_str(&format!(
            "  Python frames: read in {} samples, not readable in {}; {} code objects named in {:.0} ms\n",
            unwound.python_stacks,
            unwound.python_stacks_missing,
            meta.cost.python_code_objects,
            meta.cost.python_naming_secs * 1e3
        ));
    }
    if unwound.python_unnamed > 0 {
        out.push_str(&format!(
            "  {} samples have a Python, Java or JavaScript frame left unnamed ([unknown Python \
             code] and the like): its code was freed, or its process exited, before bpfprof \
             read it\n",
            unwound.python_unnamed
        ));
    }
    let losses = meta.losses.nonzero();
    if losses.is_empty() {
        out.push_str("  lost: none\n");
    } else {
        let list: Vec<String> = losses.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out.push_str(&format!("  lost or incomplete: {}\n", list.join(", ")));
    }
    out.push_str(&top::render(profile, 10));
    out
}
