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
    let mut lines: Vec<(String, u64)> = Vec::with_capacity(profile.stacks.len());
    let mut index: HashMap<String, usize> = HashMap::new();
    for stack in &profile.stacks {
        let line: Vec<&str> = stack.frames.iter().map(|&id| labels[id].as_str()).collect();
        let line = line.join(";");
        match index.get(&line) {
            Some(&i) => lines[i].1 += profile.stack_weight(stack),
            None => {
                index.insert(line.clone(), lines.len());
                lines.push((line, profile.stack_weight(stack)));
            }
        }
    }
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
