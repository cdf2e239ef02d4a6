//! Reading the three profilers' output into one form, folded stacks without the process name
//! (`root;...;leaf`, kernel frames suffixed `_[k]`), and the queries the sections make on it.

use std::fs;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::plan::RUN_LIMIT;
use super::process::{wait_usage, Monitor};
use super::records::{PostCost, Stacks};
use super::report::join;

/// The drops a bpfprof summary reports: every loss counter but `truncated` (a truncated stack
/// is kept, under a `[truncated]` root).
pub(super) fn drops(summary: &Value) -> u64 {
    summary["lost"].as_object().map_or(0, |o| {
        o.iter()
            .filter(|(k, _)| *k != "truncated")
            .filter_map(|(_, v)| v.as_u64())
            .sum()
    })
}

/// bpfprof's folded output (`comm;root;...;leaf COUNT`), without the process name.
pub(super) fn bpfprof_stacks(text: &str) -> Stacks {
    fold_lines(text.lines(), true)
}

/// Folded lines (`[comm;]root;...;leaf COUNT`) to stacks, dropping the first frame (the process
/// name) when `drop_comm`; malformed lines are skipped.
pub(super) fn fold_lines<'a>(lines: impl Iterator<Item = &'a str>, drop_comm: bool) -> Stacks {
    let mut stacks = Stacks::new();
    for line in lines {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.trim().parse::<u64>() else {
            continue;
        };
        let stack = if drop_comm {
            stack.split_once(';').map_or("", |(_, rest)| rest)
        } else {
            stack
        };
        *stacks.entry(stack.to_string()).or_default() += count;
    }
    stacks
}

/// Runs `perf script` on `data` and folds its output with inferno; returns the stacks and what
/// it cost.
pub(super) fn perf_stacks(data: &Path) -> Result<(Stacks, PostCost)> {
    let started = Instant::now();
    let script_out = data.with_extension("script");
    // The default fields but the period, which inferno would weight each sample by.
    let mut child = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(data)
        .args(["-F", "comm,tid,time,event,ip,sym,dso"])
        .stdin(Stdio::null())
        .stdout(File::create(&script_out)?)
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf script")?;
    let monitor = Monitor::new(child.id() as i32, RUN_LIMIT);
    let (status, usage) = wait_usage(&mut child, monitor)?;
    ensure!(
        status == 0,
        "perf script -i {} failed ({status})",
        data.display()
    );
    let mut text = Vec::new();
    File::open(&script_out)?.read_to_end(&mut text)?;
    let mut options = inferno::collapse::perf::Options::default();
    options.annotate_kernel = true;
    // Unresolved frames stay as addresses, as in the other two profilers' output.
    options.include_addrs = true;
    let mut folder = inferno::collapse::perf::Folder::from(options);
    let mut folded = Vec::new();
    inferno::collapse::Collapse::collapse(&mut folder, &text[..], &mut folded)
        .context("folding perf script output")?;
    let stacks = fold_lines(String::from_utf8_lossy(&folded).lines(), true);
    let _ = fs::remove_file(&script_out);
    Ok((
        stacks,
        PostCost {
            secs: started.elapsed().as_secs_f64(),
            usage,
        },
    ))
}

/// perf's lost records (`perf report --stats`) and the first-to-last sample span in seconds.
pub(super) fn perf_stats(data: &Path) -> (Option<u64>, Option<f64>) {
    let stats = crate::cmd::probe(
        Command::new("perf")
            .arg("report")
            .arg("-i")
            .arg(data)
            .arg("--stats"),
    );
    let lost = stats.map(|s| {
        s.lines()
            .filter(|l| l.contains("LOST"))
            .filter_map(|l| {
                l.split(':')
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    });
    let times = crate::cmd::probe(
        Command::new("perf")
            .arg("script")
            .arg("-i")
            .arg(data)
            .args(["-F", "time"]),
    );
    let span = times.and_then(|t| {
        let parse = |l: &str| l.trim().trim_end_matches(':').parse::<f64>().ok();
        let mut v = t.lines().filter_map(parse);
        let first = v.next()?;
        let last = v.next_back()?;
        Some(last - first)
    });
    (lost, span)
}

/// Parses bpftrace's printed maps. A stack map entry is
///
/// ```text
/// @s[
///     user_leaf+12
///     main+34
/// ,
///     kernel_leaf+5
/// ]: 17
/// ```
///
/// (user frames, a comma, kernel frames, leaf first; an entry with no kernel stack ends
/// `, ]: N`). Frames lose their `+offset`; kernel frames get `_[k]`. A `@n: N` line is the
/// fired-samples counter.
pub(super) fn bpftrace_stacks(text: &str) -> (Stacks, Option<u64>) {
    let mut stacks = Stacks::new();
    let mut fired = None;
    let mut user: Vec<String> = Vec::new();
    let mut kernel: Vec<String> = Vec::new();
    let mut in_kernel = false;
    let mut in_entry = false;
    for line in text.lines() {
        let t = line.trim();
        if let Some(n) = t.strip_prefix("@n: ") {
            fired = n.trim().parse().ok();
            continue;
        }
        if t.starts_with('@') && t.ends_with('[') {
            (in_entry, in_kernel) = (true, false);
            user.clear();
            kernel.clear();
            continue;
        }
        if !in_entry {
            continue;
        }
        let end = if let Some(rest) = t.strip_prefix(',') {
            in_kernel = true;
            rest.trim()
        } else {
            t
        };
        if let Some(count) = end.strip_prefix("]:") {
            if let Ok(n) = count.trim().parse::<u64>() {
                let frames = user
                    .iter()
                    .rev()
                    .cloned()
                    .chain(kernel.iter().rev().map(|f| format!("{f}_[k]")));
                *stacks.entry(join(frames, ";")).or_default() += n;
            }
            in_entry = false;
        } else if !end.is_empty() {
            let frame = strip_offset(end).to_string();
            if in_kernel { &mut kernel } else { &mut user }.push(frame);
        }
    }
    (stacks, fired)
}

/// `func+123` -> `func`; addresses and names without an offset stay as they are.
fn strip_offset(frame: &str) -> &str {
    match frame.rsplit_once('+') {
        Some((name, off)) if !name.is_empty() && off.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => frame,
    }
}

/// Share of `a` in samples attributed to `a` or `b`, in percent, and that sample count. A
/// sample is attributed to whichever of the two is nearest the leaf on its stack.
pub(super) fn share_of(stacks: &Stacks, a: &str, b: &str) -> Result<(f64, u64)> {
    let (mut na, mut nb) = (0, 0);
    for (stack, &n) in stacks {
        match stack.rsplit(';').find(|f| *f == a || *f == b) {
            Some(f) if f == a => na += n,
            Some(_) => nb += n,
            None => {}
        }
    }
    ensure!(na + nb > 0, "no samples in {a} or {b}");
    Ok((100.0 * na as f64 / (na + nb) as f64, na + nb))
}

/// The time of the first sample of `bench/startup.c` that started at `start_ns`: the middle
/// of the earliest `slot_k` millisecond on any stack.
pub(super) fn first_sample_ns(stacks: &Stacks, start_ns: u64) -> Option<u64> {
    stacks
        .keys()
        .flat_map(|s| s.split(';'))
        .filter_map(|f| f.strip_prefix("slot_")?.parse::<u64>().ok())
        .min()
        .map(|k| start_ns + k * 1_000_000 + 500_000)
}

/// Frames of a folded profile: its unique stacks' depths, summed.
pub(super) fn frames_of(stacks: &Stacks) -> u64 {
    stacks
        .keys()
        .map(|s| s.split(';').filter(|f| !f.is_empty()).count() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_map_parses_user_and_kernel_frames() {
        let text = "\n\n@n: 5\n@s[\n    leaf_hot+21\n    main+64\n, \n    irq_exit+3\n    asm_sysvec+22\n]: 3\n@s[\n    0x7f00\n    leaf_cold+9\n, ]: 2\n";
        let (stacks, fired) = bpftrace_stacks(text);
        assert_eq!(fired, Some(5));
        assert_eq!(stacks["main;leaf_hot;asm_sysvec_[k];irq_exit_[k]"], 3);
        assert_eq!(stacks["leaf_cold;0x7f00"], 2);
        assert_eq!(share_of(&stacks, "leaf_hot", "leaf_cold").unwrap().0, 60.0);
    }

    #[test]
    fn folded_lines_drop_the_process_name() {
        let stacks = bpfprof_stacks("split;main;leaf_hot 7\nsplit;main;slot_012 1\nbad line\n");
        assert_eq!(stacks["main;leaf_hot"], 7);
        assert_eq!(first_sample_ns(&stacks, 1000), Some(1000 + 12_500_000));
        assert_eq!(frames_of(&stacks), 4);
    }

    #[test]
    fn offsets_are_stripped_from_names_only() {
        assert_eq!(strip_offset("f+12"), "f");
        assert_eq!(strip_offset("0x7f+ab"), "0x7f+ab");
    }
}
