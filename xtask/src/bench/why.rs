//! The closing section, "Where bpfprof loses, and why": what the sections found ([`Findings`])
//! and the reasons behind each loss.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::plan::Tool;
use super::records::Attached;
use super::report::join;
use super::stats::{median, sorted, stat};

/// What the sections found that the closing section explains.
#[derive(Default)]
pub(super) struct Findings {
    /// Section 1, by frequency: the median excess slowdown of the timer floor, bpfprof, perf
    /// and `perf record -a`.
    pub(super) overhead: Vec<(u64, f64, f64, f64, f64)>,
    /// Section 1, by frequency: the median excess slowdown of bpfprof --fixed-interval.
    pub(super) overhead_fixed: Vec<(u64, f64)>,
    /// Section 2: bpfprof's worst aliasing run (σ, share, Hz), the same for --fixed-interval,
    /// and bpfprof's shares by frequency.
    pub(super) alias_worst: Option<(f64, f64, u64)>,
    pub(super) alias_fixed_worst: Option<(f64, f64, u64)>,
    pub(super) alias_bpfprof_runs: Vec<(u64, Vec<f64>)>,
    /// Section 3: bpfprof CLI to first sample, ms.
    pub(super) startup_ms: Option<f64>,
    /// Section 5: BPF program ns per sample (every round), and peak RSS in MiB, by profiler;
    /// bpfprof's RSS at the end of its run.
    pub(super) bpf_ns: BTreeMap<Tool, Vec<f64>>,
    pub(super) peak_rss_mib: BTreeMap<Tool, f64>,
    pub(super) bpfprof_last_rss_mib: Option<f64>,
    /// Section 6: bpfprof's (paths, unique stacks, samples kept, drops) on the large binary,
    /// and its drops by frequency on the rate ladder.
    pub(super) stacks: Vec<(String, u64, u64, u64)>,
    pub(super) rate_drops: Vec<(u64, u64)>,
}

/// The closing section: each place bpfprof loses, with the numbers from this run and the
/// reason found when the bench was written (on a 2-vCPU Firecracker VM without a PMU).
pub(super) fn why(
    md: &mut String,
    f: &Findings,
    losses: &BTreeMap<String, u64>,
    walker_verify_ms: &str,
) -> Result<()> {
    let overhead_lost = f
        .overhead
        .iter()
        .any(|(_, _, b, p, _)| *p <= 0.0 && *b > 0.0 || *p > 0.0 && *b > 0.5 * p);
    if !f.overhead.is_empty() && !overhead_lost {
        writeln!(
            md,
            "**Overhead**: at most half of perf's at every frequency in this run.\n"
        )?;
    }
    if overhead_lost {
        let cells = join(
            f.overhead.iter().map(|(hz, floor, b, p, _)| {
                format!(
                    "{hz} Hz: floor {:+.1}%, bpfprof {:+.1}%, perf {:+.1}%",
                    floor * 100.0,
                    b * 100.0,
                    p * 100.0
                )
            }),
            "; ",
        );
        let per_sample = f
            .overhead
            .iter()
            .max_by_key(|o| o.0)
            .map(|(hz, floor, _, _, _)| floor / *hz as f64 * 1e6)
            .unwrap_or(f64::NAN);
        let bpf_us = f
            .bpf_ns
            .get(&Tool::Bpfprof)
            .map_or(f64::NAN, |ns| median(ns) / 1000.0);
        // Frequencies where perf came out clearly cheaper than the per-CPU timer floor.
        let per_task = join(
            f.overhead
                .iter()
                .filter(|(_, floor, _, p, _)| floor - p > 0.01)
                .map(|(hz, floor, _, p, pa)| {
                    format!(
                        "{hz} Hz (perf {:+.1}%, floor {:+.1}%, `perf record -a` {:+.1}%)",
                        p * 100.0,
                        floor * 100.0,
                        pa * 100.0
                    )
                }),
            ", ",
        );
        let per_task = if per_task.is_empty() {
            String::new()
        } else {
            format!(" Where perf did come out cheaper than the floor, at {per_task}, the likely difference is the kind of event: `perf record -- CMD` opens per-task events, whose timers run only while the target's threads run, while bpfprof, like bpftrace, opens one system-wide event per CPU so that one kernel program serves any set of targets (compare `perf record -a`, per-CPU as well, in the same rounds); the gap is a few points, of the order of the rounds' spread.")
        };
        let randomizing = join(
            f.overhead
                .iter()
                .zip(&f.overhead_fixed)
                .map(|((hz, _, b, _, _), (_, fixed))| {
                    format!("{hz} Hz: {:+.1} points", (b - fixed) * 100.0)
                }),
            ", ",
        );
        let randomizing = format!(" Randomized periods against `--fixed-interval` (bpfprof's slowdown less that of bpfprof with fixed periods, medians): {randomizing}; each redraw restarts one CPU's timer through an ioctl and an inter-processor interrupt, also trapped by the hypervisor here.");
        // bpfprof above its own floor, by rate: a cost per sample grows with the rate, a cost
        // per run (bpfprof's start-up work on the workload's CPUs) does not.
        let above_floor: Vec<(u64, f64)> = f
            .overhead
            .iter()
            .map(|(hz, floor, b, _, _)| (*hz, b - floor))
            .collect();
        let least_above = above_floor
            .iter()
            .map(|(_, e)| *e)
            .fold(f64::INFINITY, f64::min);
        let cause = if least_above > 0.02 {
            format!("bpfprof costs more than its timer floor at every rate ({}), about as much at the lowest rate as at the highest: a cost per run, not per sample. It is bpfprof's own start-up work on the workload's CPUs while the short workload keeps every core busy: the kernel verifying the CFI/Python walker program ({} ms of CPU, once per bpfprof process; section 10 gives bpfprof's whole CPU next to the work's) and building unwind tables (symbolization comes after the workload's own timing ends). The floor's bpfprof attached before the workload started and did that work outside the timing. On a longer run the cost is the same and its share smaller, and the daemon pays the verification once for a series of runs. The floor itself is", join(above_floor.iter().map(|(hz, e)| format!("{hz} Hz: {:+.1} points", e * 100.0)), ", "), walker_verify_ms)
        } else {
            "bpfprof costs what its timer floor costs: the sampling timers alone, with the kernel program rejecting every sample and no stack walked, slow the workload about as much as bpfprof recording it does, and about as much as perf does. The floor is".to_string()
        };
        let lowest_in_noise = f
            .overhead
            .iter()
            .min_by_key(|o| o.0)
            .filter(|(_, floor, b, p, _)| [floor, b, p].iter().all(|x| x.abs() < 0.02))
            .map_or(String::new(), |(hz, ..)| {
                format!(
                    " At {hz} Hz all three are within noise of running alone, and so is the ratio."
                )
            });
        writeln!(md, "**Overhead: not half of perf's.** Medians of this run: {cells}.{randomizing} {cause} the sampling timers' cost. At the highest frequency the floor works out to about {per_sample:.0} µs of the workload's time per sample, of which bpfprof's kernel program is {bpf_us:.1} µs (section 5): the rest is the `cpu-clock` interrupt itself, which all three profilers take at the same rate. This machine is a virtual machine without a PMU (a Firecracker guest), where timer interrupts and timer re-arms are trapped by the hypervisor; that, not what a profiler does with a sample, is the cost.{per_task} Halving perf's overhead would take fewer interrupts (a lower rate) or cheaper ones (a PMU on bare metal, where an interrupt costs a few µs and the per-sample work weighs more), not a cheaper kernel program.{lowest_in_noise}\n")?;
    }
    if let Some((z, share, hz)) = f.alias_worst {
        let runs = join(
            f.alias_bpfprof_runs.iter().map(|(hz, v)| {
                format!(
                    "{hz} Hz: {}",
                    join(v.iter().map(|s| format!("{s:.1}")), ", ")
                )
            }),
            "; ",
        );
        let fixed = f.alias_fixed_worst.map_or(String::new(), |(z, s, hz)| {
            format!(" (with `--fixed-interval`: {s:.1}% at {hz} Hz, {z:.1}σ)")
        });
        if z > 3.0 {
            writeln!(md, "**Aliasing: randomized, but a run strayed.** bpfprof's shares for `leaf_hot` (truth 75%) in this run: {runs}. Its worst run, {share:.1}% at {hz} Hz, is {z:.1}σ from the truth{fixed}. Each CPU's period is redrawn after 2 to 6 mean periods (20 to 60 ms at the least), and each redraw restarts the timer at a moment unrelated to the workload, so few consecutive samples share a phase of the loop; a run this far out means a longer stretch stayed in phase, which this bench cannot tell apart from the scheduler delaying the redraw thread.\n")?;
        } else {
            writeln!(md, "**Aliasing: none left.** bpfprof's shares for `leaf_hot` (truth 75%) in this run: {runs}; its worst run is {z:.1}σ from the truth (binomial σ at that run's sample count){fixed}. Each CPU's period is redrawn after 2 to 6 mean periods (20 to 60 ms at the least), and each redraw restarts the timer at a moment unrelated to the workload, so no phase of the loop is sampled for more than one span in a row.\n")?;
        }
    }
    if f.stacks.iter().any(|(_, _, _, drops)| *drops > 0) {
        let rows = join(
            f.stacks.iter().map(|(k, uniq, kept, drops)| {
                format!(
                    "{}: {uniq} unique stacks, {drops} of {} samples dropped ({:.0}%)",
                    if k.starts_with("unlimited") {
                        "unlimited paths (section 4)".to_string()
                    } else {
                        format!("{k} paths")
                    },
                    kept + drops,
                    100.0 * *drops as f64 / (kept + drops).max(1) as f64
                )
            }),
            "; ",
        );
        let reasons = join(
            losses
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(k, n)| format!("`{k}` {n}")),
            ", ",
        );
        let ladder = match f.rate_drops.iter().filter(|(_, d)| *d > 0).min_by_key(|(hz, _)| *hz) {
            None => f.rate_drops.iter().map(|(hz, _)| *hz).max().map_or(String::new(), |hz| {
                format!(" With the few stacks of a typical program (section 6's rate ladder) bpfprof dropped nothing up to {hz} Hz.")
            }),
            Some((hz, d)) => format!(" Even with the few stacks of section 6's rate ladder bpfprof dropped {d} samples at {hz} Hz."),
        };
        writeln!(md, "**Drops with many unique stacks.** On the generated binary at 4999 Hz: {rows}. Over the whole bench bpfprof counted {reasons}. The kernel program stores each stack in a preallocated BPF hash map under a 64-bit hash of its frames (16384 entries of 1 KiB), and bpfprof moves the stacks to userspace every half second, or at every tick (100–200 ms) while over a thousand new stacks arrive per move, so the map fills only if 16384 new stacks arrive within one tick; sample-map-full means more than 65536 distinct (thread, user stack, kernel stack) keys in one run. perf copies every stack into its ring buffer; bpftrace keeps stacks in a stack trace map, which refuses a stack whose bucket is taken, plus a 4096-key limit on its map.{ladder}\n")?;
    }
    if let (Some(b), Some(p)) = (
        f.peak_rss_mib.get(&Tool::Bpfprof),
        f.peak_rss_mib.get(&Tool::Perf),
    ) {
        if b > p {
            let last = f.bpfprof_last_rss_mib.map_or(String::new(), |m| {
                format!(" (in this run {m:.1} MiB just before exit)")
            });
            let startup = f.startup_ms.map_or(String::new(), |ms| {
                format!(" ({ms:.0} ms to the first sample in section 3)")
            });
            let bpftrace = f
                .peak_rss_mib
                .get(&Tool::Bpftrace)
                .copied()
                .unwrap_or(f64::NAN);
            writeln!(md, "**Peak memory: more than `perf record`** ({b:.1} MiB against {p:.1} MiB in section 5; bpftrace {bpftrace:.1} MiB). bpfprof's peak is a start-up transient: aya's loader (0.14) parses the kernel's BTF (`/sys/kernel/btf/vmlinux`) whenever it is created, which heaptrack showed as about 9 MiB of heap at the peak, although bpfprof's program needs no BTF relocation; while it samples, bpfprof's resident size is about 9 MiB (`/proc/PID/smaps_rollup` during a run when this bench was written), and it grows again at the end, when stacks are symbolized{last}. With many distinct stacks the end is the peak instead (section 4: blazesym's view of a 13 MiB binary's DWARF plus every stack held for aggregation). The same parse is part of bpfprof's start-up{startup}; an aya release that lets a loader skip it would cut both.\n")?;
        }
    }
    if let (Some(b), Some(t)) = (f.bpf_ns.get(&Tool::Bpfprof), f.bpf_ns.get(&Tool::Bpftrace)) {
        if median(b) > median(t) {
            let (sb, st) = (sorted(b), sorted(t));
            let overlap = sb.first() <= st.last() && st.first() <= sb.last();
            writeln!(md, "**Kernel program per sample: no cheaper than bpftrace's** ({} ns against {} ns{}). Both walk the user and kernel stacks of a target's sample (frame pointers, then the kernel's unwinder) and update a hash map; bpfprof copies each stack with `bpf_get_stack` and hashes its frames itself (bpftrace's `bpf_get_stackid` hashes them in the kernel), and first looks up the sample's pid namespace so that it can tell targets apart across containers. The stack walks dominate.\n", stat(b, 0), stat(t, 0), if overlap { "; the spreads overlap" } else { "" })?;
        }
    }
    Ok(())
}

/// Peak RSS of a profiler in MiB; for perf, the larger of `perf record` and `perf script`.
pub(super) fn peak_rss_mib(a: &Attached) -> f64 {
    a.usage
        .max_rss_kib
        .max(a.post.map_or(0.0, |p| p.usage.max_rss_kib))
        / 1024.0
}

/// From the stop signal to stacks: the profiler's exit, plus perf's `perf script` and folding.
pub(super) fn end_secs(a: &Attached) -> f64 {
    a.stop_secs + a.post.map_or(0.0, |p| p.secs)
}
