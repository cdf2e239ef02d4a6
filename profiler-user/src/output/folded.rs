//! Folded stacks (Brendan Gregg's collapsed format): `root;...;leaf COUNT`, one line a stack,
//! kernel frames suffixed `_[k]` as flamegraph.pl and inferno color them. A profile with
//! off-CPU time counts nanoseconds instead of samples (CPU stacks their samples times the
//! period), its off-CPU stacks ending in `[off-cpu: STATE]`.

use std::io::{self, Write};

use crate::profile::Profile;

/// Writes `profile` as folded stacks, most frequent first (stacks of one count in the order of
/// their frames' labels). Stacks that read the same (they differed only in addresses) are one
/// line.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let labels = frame_labels(profile);
    // Frames of one label (a function's lines, without --line-numbers) are one frame here:
    // each frame gets its label's rank among the labels, so that comparing two stacks' ranks
    // compares their labels. Each line is written as it is made, from one of its stacks: a
    // run's end held every line as a string, and every stack's ranks twice, 18 MB of its
    // peak at 25k stacks.
    let mut unique: Vec<&str> = labels.iter().map(String::as_str).collect();
    unique.sort_unstable();
    unique.dedup();
    let rank_of: Vec<u32> = labels
        .iter()
        .map(|l| unique.binary_search(&l.as_str()).unwrap_or_default() as u32)
        .collect();
    let ranks = |i: usize| profile.stacks[i].frames.iter().map(|&id| rank_of[id]);
    let mut order: Vec<usize> = (0..profile.stacks.len()).collect();
    order.sort_unstable_by(|&a, &b| ranks(a).cmp(ranks(b)));
    // Stacks that read the same are now next to each other: one line each, with its weight.
    let mut lines: Vec<(usize, u64)> = Vec::with_capacity(order.len());
    for i in order {
        let weight = profile.stack_weight(&profile.stacks[i]);
        match lines.last_mut() {
            Some((first, total)) if ranks(*first).eq(ranks(i)) => *total += weight,
            _ => lines.push((i, weight)),
        }
    }
    // Stable: lines of one weight stay in their labels' order.
    lines.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
    for (i, count) in lines {
        for (n, rank) in ranks(i).enumerate() {
            if n > 0 {
                w.write_all(b";")?;
            }
            w.write_all(unique[rank as usize].as_bytes())?;
        }
        writeln!(w, " {count}")?;
    }
    Ok(())
}

/// Each frame of `profile` as a folded line names it.
pub fn frame_labels(profile: &Profile) -> Vec<String> {
    profile
        .frames
        .iter()
        .map(|frame| {
            // `;` separates frames and a line ends in " N", the count: neither may appear
            // inside. A name can be a target's own bytes (a thread's or an asyncio task's
            // name), control characters (a newline, a NUL, a terminal's escapes) included: each
            // becomes U+FFFD, as the SVG shows it.
            let name: String = frame
                .label()
                .chars()
                .map(|c| match c {
                    ';' => ':',
                    c if c.is_control() => char::REPLACEMENT_CHARACTER,
                    c => c,
                })
                .collect();
            if frame.is_kernel() {
                format!("{name}_[k]")
            } else {
                name
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::profile::ProfileFrame;

    #[test]
    fn separators_and_control_characters_in_names_cannot_split_a_line() {
        let mut profile = crate::output::fixture::profile();
        profile.frames[1] = ProfileFrame::Thread {
            name: "task\0a;b\nc\rd".into(),
            tid: 7,
            comm: String::new(),
        };
        let labels = super::frame_labels(&profile);
        assert_eq!(labels[1], "task\u{FFFD}a:b\u{FFFD}c\u{FFFD}d");
        assert_eq!(labels[2], "main (app.c:10)");
    }
}
