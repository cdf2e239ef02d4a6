//! The top-functions table: self and total samples per function, like `perf report`.
//!
//! A function is one row whichever of its lines was sampled: rows are keyed by the function's
//! name, file and first line, never by the sampled line.

use std::{collections::HashMap, fmt::Write as _};

use crate::{
    profile::{Profile, ProfileFrame, StackCount},
    sampling::{Event, Rate},
};

/// One function's share of the samples.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionShare {
    /// Function name, with `(file:first line)` where `--line-numbers` found them.
    pub name: String,
    /// Whether the function is kernel code.
    pub kernel: bool,
    /// Samples with this function at the leaf.
    pub self_samples: u64,
    /// Samples with this function anywhere on the stack (recursion counted once).
    pub total_samples: u64,
    /// The part of `total_samples` spent off the CPU (nanoseconds, in a profile with off-CPU
    /// time; 0 otherwise): the function's wait, the rest its CPU time.
    pub total_off_cpu: u64,
}

/// Self and total samples of every code function, most self samples first.
pub fn function_shares(profile: &Profile) -> Vec<FunctionShare> {
    shares_of(profile, profile.stacks.iter())
}

/// [`function_shares`] over some of the profile's stacks.
fn shares_of<'a>(
    profile: &Profile,
    stacks: impl Iterator<Item = &'a StackCount>,
) -> Vec<FunctionShare> {
    // Rows by (kernel, label) with their (self, total) samples; frames of one function
    // (different sampled lines, inlined copies) share a row. Each frame's row is found once,
    // so that stacks add up row numbers, not labels hashed again for every frame.
    // Each row's key and its (self, total, total off the CPU) weights.
    type Row = ((bool, String), (u64, u64, u64));
    let mut rows: Vec<Row> = Vec::new();
    let mut row_of: HashMap<(bool, String), usize> = HashMap::new();
    let keys: Vec<Option<usize>> = profile
        .frames
        .iter()
        .map(|frame| match frame {
            ProfileFrame::Code(_) => {
                let key = (frame.is_kernel(), frame.function_label());
                Some(*row_of.entry(key.clone()).or_insert_with(|| {
                    rows.push((key, (0, 0, 0)));
                    rows.len() - 1
                }))
            }
            _ => None,
        })
        .collect();
    // The stack each row was last counted in (its total counts a recursive function once).
    let mut counted_in: Vec<usize> = vec![usize::MAX; rows.len()];
    for (n, stack) in stacks.enumerate() {
        let off_cpu = profile.off_cpu_state(stack).is_some();
        // Samples, or nanoseconds in a profile with off-CPU time.
        let weight = profile.stack_weight(stack);
        let mut leaf = None;
        for row in stack.frames.iter().filter_map(|&id| keys[id]) {
            leaf = Some(row);
            if counted_in[row] != n {
                counted_in[row] = n;
                let entry = &mut rows[row].1;
                entry.1 += weight;
                if off_cpu {
                    entry.2 += weight;
                }
            }
        }
        if let Some(row) = leaf {
            rows[row].1 .0 += weight;
        }
    }
    let mut out: Vec<FunctionShare> = rows
        .into_iter()
        .zip(counted_in)
        // A row no stack reached (a frame only of stacks left out) says nothing.
        .filter(|(_, counted)| *counted != usize::MAX)
        .map(
            |(((kernel, name), (self_samples, total_samples, total_off_cpu)), _)| FunctionShare {
                name,
                kernel,
                self_samples,
                total_samples,
                total_off_cpu,
            },
        )
        .collect();
    out.sort_by(|a, b| {
        b.self_samples
            .cmp(&a.self_samples)
            .then(b.total_samples.cmp(&a.total_samples))
            .then(a.name.cmp(&b.name))
            .then(a.kernel.cmp(&b.kernel))
    });
    out
}

/// The first line of the `.txt` table: what one sample is, so that counts read as time.
pub fn header(profile: &Profile) -> String {
    let sampling = &profile.meta.sampling;
    let period = match (sampling.event, sampling.rate) {
        (_, Rate::Frequency(hz)) => format!("set by the kernel to hold {hz} Hz"),
        (Event::Cycles, Rate::Period(p)) => format!("{p} cycles"),
        (Event::CpuClock, Rate::Period(p)) => format!("{p} ns"),
    };
    let mut line = format!(
        "{} samples; event: {}; period: {period}; one sample: {} ns of CPU time",
        profile.total_samples(),
        sampling.event,
        profile.meta.sample_nanos()
    );
    if profile.meta.off_cpu.is_some() {
        let (cpu, off) = profile.time_totals();
        let states: Vec<String> = off
            .iter()
            .map(|(state, ns)| format!("{} {ns}", state.name()))
            .collect();
        let _ = write!(
            line,
            "; in ns: CPU {cpu}, off the CPU {} ({})",
            off.values().sum::<u64>(),
            states.join(", ")
        );
    }
    line
}

/// The `.txt` file (and `--format top`): the header, then every function by self and by
/// total samples; a per-thread profile adds one such table per thread after the whole's.
pub fn render_file(profile: &Profile) -> String {
    let mut out = format!("{}\n\n{}", header(profile), render(profile, usize::MAX));
    for (thread, stacks) in threads(profile) {
        let samples: u64 = stacks.iter().map(|s| profile.stack_weight(s)).sum();
        let _ = write!(
            out,
            "\n{thread}: {samples} {} ({:.2}% of all)\n",
            profile.weight_unit(),
            100.0 * samples as f64 / profile.total_weight().max(1) as f64
        );
        out.push_str(&render_stacks(profile, &stacks, samples, usize::MAX));
    }
    out
}

/// Each thread's stacks, named `process (pid N) / thread`, in the order of their first stack;
/// none when the profile is not per-thread.
fn threads(profile: &Profile) -> Vec<(String, Vec<&StackCount>)> {
    let mut order: Vec<(String, Vec<&StackCount>)> = Vec::new();
    let mut index: HashMap<(usize, usize), usize> = HashMap::new();
    for stack in &profile.stacks {
        let process = stack
            .frames
            .iter()
            .copied()
            .find(|&id| matches!(profile.frames[id], ProfileFrame::Process { .. }));
        let thread = stack
            .frames
            .iter()
            .copied()
            .find(|&id| matches!(profile.frames[id], ProfileFrame::Thread { .. }));
        let Some(thread) = thread else { continue };
        let key = (process.unwrap_or(usize::MAX), thread);
        let i = *index.entry(key).or_insert_with(|| {
            let name = match process.map(|p| &profile.frames[p]) {
                Some(ProfileFrame::Process { comm, pid, .. }) => {
                    format!("{comm} (pid {pid}) / {}", profile.frames[thread].name())
                }
                _ => profile.frames[thread].name().to_string(),
            };
            order.push((name, Vec::new()));
            order.len() - 1
        });
        order[i].1.push(stack);
    }
    order
}

/// Renders the `limit` functions with most self samples and most total samples: samples and
/// percentages, `[k]` for kernel functions and `[.]` for user ones, as `perf report` marks them.
pub fn render(profile: &Profile, limit: usize) -> String {
    let stacks: Vec<&StackCount> = profile.stacks.iter().collect();
    render_stacks(profile, &stacks, profile.total_weight(), limit)
}

/// [`render`] over some of the profile's stacks, whose samples are `total`.
fn render_stacks(profile: &Profile, stacks: &[&StackCount], total: u64, limit: usize) -> String {
    let total = total.max(1) as f64;
    let mut shares = shares_of(profile, stacks.iter().copied());
    let mut out = String::new();
    let pct = |n: u64| 100.0 * n as f64 / total;
    // With off-CPU time, each row also splits its total into time on the CPU and waiting.
    let split = profile.meta.off_cpu.is_some();
    let row = |out: &mut String, first: u64, second: u64, s: &FunctionShare| {
        let _ = write!(
            out,
            "  {:>9} {:>6.2}% {:>9} {:>6.2}%",
            first,
            pct(first),
            second,
            pct(second),
        );
        if split {
            let wait = s.total_off_cpu;
            let cpu = s.total_samples - wait;
            let _ = write!(out, " {:>11} {:>11}", cpu, wait);
        }
        let _ = writeln!(out, "  {} {}", if s.kernel { "[k]" } else { "[.]" }, s.name);
    };
    let split_heading = if split {
        format!(" {:>11} {:>11}", "total cpu", "total wait")
    } else {
        String::new()
    };
    let unit = profile.weight_unit();
    let _ = writeln!(out, "top functions by self {unit}:");
    let _ = writeln!(
        out,
        "  {:>17} {:>17}{split_heading}  function",
        format!("self {unit}"),
        format!("total {unit}")
    );
    for s in shares.iter().take(limit) {
        row(&mut out, s.self_samples, s.total_samples, s);
    }
    shares.sort_by(|a, b| {
        b.total_samples
            .cmp(&a.total_samples)
            .then(a.name.cmp(&b.name))
    });
    let _ = writeln!(out, "top functions by total {unit}:");
    let _ = writeln!(
        out,
        "  {:>17} {:>17}{split_heading}  function",
        format!("total {unit}"),
        format!("self {unit}")
    );
    for s in shares.iter().take(limit) {
        row(&mut out, s.total_samples, s.self_samples, s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;

    #[test]
    fn rows_are_functions_with_counts_and_plain_names() {
        // leaf_hot also sampled at another line of it: still one row.
        let profile = fixture::profile_with_leaf_hot_at_two_lines();
        let shares = function_shares(&profile);
        let hot: Vec<&FunctionShare> = shares
            .iter()
            .filter(|s| s.name.starts_with("leaf_hot"))
            .collect();
        assert_eq!(hot.len(), 1, "{shares:?}");
        assert_eq!(hot[0].name, "leaf_hot (app.c:28)");
        assert_eq!((hot[0].self_samples, hot[0].total_samples), (75, 75));
        let write = shares.iter().find(|s| s.name == "sys_write").unwrap();
        assert!(write.kernel);

        let table = render_file(&profile);
        assert!(!table.contains("_[k]"), "{table}");
        let first = table.lines().next().unwrap();
        assert_eq!(
            first,
            "105 samples; event: cpu-clock; period: 1001001 ns; one sample: 1001001 ns of CPU time"
        );
        let row = table
            .lines()
            .find(|l| l.contains("leaf_hot"))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>();
        assert_eq!(
            row,
            [
                "75",
                "71.43%",
                "75",
                "71.43%",
                "[.]",
                "leaf_hot",
                "(app.c:28)"
            ]
        );
        assert!(table.contains("[k] sys_write"), "{table}");
    }

    /// `--per-thread`: after the whole's table, one per thread, each with its own counts and
    /// shares of its own samples (issue 27: one table for all threads hid which one burned).
    #[test]
    fn a_per_thread_profile_gets_one_table_per_thread() {
        let mut profile = fixture::profile();
        profile.frames.push(ProfileFrame::Thread {
            name: "app (tid 1234)".into(),
            tid: 1234,
            comm: "app".into(),
        });
        profile.frames.push(ProfileFrame::Thread {
            name: "worker (tid 1240)".into(),
            tid: 1240,
            comm: "worker".into(),
        });
        let (main, worker) = (profile.frames.len() - 2, profile.frames.len() - 1);
        let process = profile
            .stacks
            .first()
            .and_then(|s| {
                s.frames
                    .iter()
                    .position(|&id| matches!(profile.frames[id], ProfileFrame::Process { .. }))
            })
            .expect("the fixture's stacks have a process root");
        for (i, stack) in profile.stacks.iter_mut().enumerate() {
            stack
                .frames
                .insert(process + 1, if i == 0 { main } else { worker });
        }
        let first: u64 = profile.stacks[0].count;
        let rest: u64 = profile.stacks[1..].iter().map(|s| s.count).sum();
        let table = render_file(&profile);
        let sections: Vec<&str> = table
            .lines()
            .filter(|l| l.contains(" / ") && l.contains("samples ("))
            .collect();
        assert_eq!(sections.len(), 2, "{table}");
        assert!(
            sections[0].contains("/ app (tid 1234)")
                && sections[0].contains(&format!(": {first} samples")),
            "{table}"
        );
        assert!(
            sections[1].contains("/ worker (tid 1240)")
                && sections[1].contains(&format!(": {rest} samples")),
            "{table}"
        );
        // Each section's shares are of its own samples: its top row's total is 100%.
        let after = table.split(sections[0]).nth(1).unwrap();
        let by_total = after
            .split("top functions by total samples:")
            .nth(1)
            .unwrap();
        let top_row = by_total.lines().nth(2).unwrap();
        assert!(top_row.contains(&format!("{first} 100.00%")), "{table}");
        // A profile without threads has only the whole's table.
        assert!(!render_file(&fixture::profile()).contains(" / "));
    }
}
