//! Folded stacks (Brendan Gregg's collapsed format): `root;...;leaf COUNT`, one line a stack,
//! kernel frames suffixed `_[k]` as flamegraph.pl and inferno color them. A profile with
//! off-CPU time counts nanoseconds instead of samples (CPU stacks their samples times the
//! period), its off-CPU stacks ending in `[off-cpu: STATE]`.

use std::{
    collections::HashMap,
    io::{self, Write},
};

use crate::profile::Profile;

/// Writes `profile` as folded stacks, most frequent first. Stacks that read the same (they
/// differed only in addresses) are one line.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let labels = frame_labels(profile);
    // Frames of one label (a function's lines, without --line-numbers) are one frame here:
    // stacks are merged by their labels' numbers, and each line is made once, after.
    let mut label_ids: HashMap<&str, u32> = HashMap::new();
    let label_of: Vec<u32> = labels
        .iter()
        .map(|l| {
            let next = label_ids.len() as u32;
            *label_ids.entry(l.as_str()).or_insert(next)
        })
        .collect();
    let mut merged: Vec<(Vec<u32>, u64)> = Vec::with_capacity(profile.stacks.len());
    let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
    for stack in &profile.stacks {
        let key: Vec<u32> = stack.frames.iter().map(|&id| label_of[id]).collect();
        match index.get(&key) {
            Some(&i) => merged[i].1 += profile.stack_weight(stack),
            None => {
                index.insert(key.clone(), merged.len());
                merged.push((key, profile.stack_weight(stack)));
            }
        }
    }
    drop(index);
    let mut by_id: Vec<&str> = vec![""; label_ids.len()];
    for (label, id) in label_ids {
        by_id[id as usize] = label;
    }
    let mut lines: Vec<(String, u64)> = merged
        .into_iter()
        .map(|(key, count)| {
            let line: Vec<&str> = key.iter().map(|&id| by_id[id as usize]).collect();
            (line.join(";"), count)
        })
        .collect();
    lines.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    for (line, count) in lines {
        writeln!(w, "{line} {count}")?;
    }
    Ok(())
}

/// Each frame of `profile` as a folded line names it.
pub fn frame_labels(profile: &Profile) -> Vec<String> {
    profile
        .frames
        .iter()
        .map(|frame| {
            // `;` separates frames and a trailing " N" is the count: neither may appear inside.
            let name = frame.label().replace(';', ":").replace('\n', " ");
            if frame.is_kernel() {
                format!("{name}_[k]")
            } else {
                name
            }
        })
        .collect()
}
