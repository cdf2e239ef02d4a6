//! Text a target or a user controls (process and thread names, tags, function and file
//! names, paths), made safe to print to a terminal: a name holding ESC, an OSC sequence or a
//! CR could retitle, recolor or rewrite the screen of whoever runs `bpfprof list` (root
//! included). Every control character is shown as an escape (`\x1b`, `\r`, `\u{9b}`), and so
//! are the Unicode controls that reorder text (bidirectional overrides), so that what is
//! shown is what the name holds.

use std::{borrow::Cow, fmt::Write as _};

/// Whether `c` is shown escaped: C0 and C1 controls, DEL, and the bidirectional formatting
/// characters (which make text read in another order than it is stored).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `text` with every control character escaped (newlines too: one name, one line).
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_but(text, |_| false)
}

/// `text`, a block of lines bpfprof laid out around names it holds, with every control
/// character but the newline (and the tab) escaped.
pub fn escape_lines(text: &str) -> Cow<'_, str> {
    escape_but(text, |c| c == '\n' || c == '\t')
}

fn escape_but(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| unsafe_char(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) && !keep(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_escaped() {
        assert_eq!(escape("python3.12"), "python3.12");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\x1b]0;pwned\x07b\rc\u{9b}d\u{202e}e\nf"),
            "a\\x1b]0;pwned\\x07b\\rc\\u{9b}d\\u{202e}e\\nf"
        );
        assert_eq!(escape_lines("x\x1b[2J\ny\tz\n"), "x\\x1b[2J\ny\tz\n");
        assert_eq!(escape("café"), "café");
    }
}
