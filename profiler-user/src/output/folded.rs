//! Folded stacks (Brendan Gregg's collapsed format): `root;...;leaf COUNT`, one line a stack,
//! kernel frames suffixed `_[k]` as flamegraph.pl and inferno color them.

use std::io::{self, Write};

use crate::aggregate::Profile;

/// Writes `profile` as folded stacks, most frequent first.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    for stack in &profile.stacks {
        let mut first = true;
        for &id in &stack.frames {
            if !first {
                w.write_all(b";")?;
            }
            first = false;
            let frame = &profile.frames[id];
            // `;` separates frames and a trailing " N" is the count: neither may appear inside.
            let name = frame.label().replace(';', ":").replace('\n', " ");
            w.write_all(name.as_bytes())?;
            if frame.is_kernel() {
                w.write_all(b"_[k]")?;
            }
        }
        writeln!(w, " {}", stack.count)?;
    }
    Ok(())
}
