//! CPython's tables from bytecode offsets to source lines, as stored in `co_linetable`.
//!
//! Two formats, decoded exactly as CPython's own `PyCode_Addr2Line` walks them
//! (`Objects/codeobject.c`, function `advance`):
//!
//! * 3.10 (PEP 626, `Objects/lnotab_notes.txt`): pairs of bytes `(sdelta: u8, ldelta: i8)`. Each
//!   pair ends the current address range `sdelta` bytes later and moves the line by `ldelta`;
//!   `ldelta == -128` means the range has no line. Pairs with `sdelta == 0` only move the line.
//! * 3.11 and later (the location table, `Objects/locations.md`): entries whose first byte has
//!   bit 7 set, bits 3-6 a kind and bits 0-2 the range's length in code units minus one. The kind
//!   says how the line moves: 15 no line (the line stays), 14 long form and 13 no-column form
//!   (a signed varint line delta follows), 10-12 one-line forms (delta `kind - 10`), 0-9 short
//!   forms (delta 0). Varints are 6-bit groups, least significant first, bit 6 meaning "more";
//!   a signed varint is an unsigned one with the sign in bit 0.
//!
//! Both give, for a byte offset into the code, the line of the range holding it, or `None` for
//! code without a line (or past the table's end).

/// Which of CPython's two line table formats a code object uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.10's PEP 626 table of (address delta, line delta) byte pairs.
    Pep626,
    /// 3.11 and later's location table.
    Locations,
}

/// One address range of a line table: bytes `start..end` of the code are on `line`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRange {
    /// First byte offset of the range.
    pub start: u32,
    /// Byte offset just past the range.
    pub end: u32,
    /// The range's line, `None` where the code has no line (artificial instructions).
    pub line: Option<u32>,
}

/// Bytes per CPython code unit (`_Py_CODEUNIT`).
const CODE_UNIT: u32 = 2;

/// All address ranges of a table, in address order, empty ranges left out (as `co_lines()`
/// does; unlike `co_lines()` adjacent ranges on the same line are not merged).
pub fn ranges(format: LineTableFormat, table: &[u8], first_line: u32) -> Vec<LineRange> {
    match format {
        LineTableFormat::Pep626 => pep626_ranges(table, first_line),
        LineTableFormat::Locations => location_ranges(table, first_line),
    }
}

/// The line of byte offset `addr` of the code, as `PyCode_Addr2Line` gives it.
pub fn line_for_offset(
    format: LineTableFormat,
    table: &[u8],
    first_line: u32,
    addr: u32,
) -> Option<u32> {
    ranges(format, table, first_line)
        .into_iter()
        .find(|r| r.start <= addr && addr < r.end)
        .and_then(|r| r.line)
}

fn pep626_ranges(table: &[u8], first_line: u32) -> Vec<LineRange> {
    let mut out = Vec::new();
    let mut line = first_line as i64;
    let mut end = 0u32;
    for pair in table.chunks_exact(2) {
        let sdelta = pair[0] as u32;
        let ldelta = pair[1] as i8;
        let start = end;
        end = end.saturating_add(sdelta);
        let this_line = if ldelta == -128 {
            None
        } else {
            line = line.saturating_add(ldelta as i64);
            u32::try_from(line).ok()
        };
        if sdelta != 0 {
            out.push(LineRange {
                start,
                end,
                line: this_line,
            });
        }
    }
    out
}

/// Location-table entry kinds (`_PyCodeLocationInfoKind`) that change the line.
const KIND_NONE: u8 = 15;
const KIND_LONG: u8 = 14;
const KIND_NO_COLUMNS: u8 = 13;
const KIND_ONE_LINE0: u8 = 10;
const KIND_ONE_LINE2: u8 = 12;

fn location_ranges(table: &[u8], first_line: u32) -> Vec<LineRange> {
    let mut out = Vec::new();
    let mut line = first_line as i64;
    let mut end = 0u32;
    let mut at = 0usize;
    while at < table.len() {
        let first = table[at];
        if first & 0x80 == 0 {
            // Not an entry's first byte: a corrupt table; stop rather than guess.
            break;
        }
        let kind = (first >> 3) & 0x0f;
        let length = ((first & 7) as u32 + 1) * CODE_UNIT;
        let delta = match kind {
            KIND_LONG | KIND_NO_COLUMNS => signed_varint(&table[at + 1..]),
            KIND_ONE_LINE0..=KIND_ONE_LINE2 => (kind - KIND_ONE_LINE0) as i64,
            _ => 0,
        };
        // Deltas come from the target's memory: a torn or hostile table must not overflow.
        line = line.saturating_add(delta);
        let start = end;
        end = end.saturating_add(length);
        out.push(LineRange {
            start,
            end,
            line: if kind == KIND_NONE {
                None
            } else {
                u32::try_from(line).ok()
            },
        });
        // The next entry starts at the next byte with bit 7 set.
        at += 1;
        while at < table.len() && table[at] & 0x80 == 0 {
            at += 1;
        }
    }
    out
}

/// An unsigned varint of 6-bit groups, least significant first, bit 6 meaning "more follows".
fn varint(bytes: &[u8]) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    for &b in bytes {
        if shift >= 64 {
            break;
        }
        value |= ((b & 0x3f) as u64) << shift;
        shift += 6;
        if b & 0x40 == 0 {
            break;
        }
    }
    value
}

/// A signed varint: the unsigned one's bit 0 is the sign, the rest the magnitude.
fn signed_varint(bytes: &[u8]) -> i64 {
    let v = varint(bytes);
    let magnitude = (v >> 1) as i64;
    if v & 1 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        assert_eq!(varint(&[0x05]), 5);
        // 0x41: 1 with "more"; 0x02: 2 << 6.
        assert_eq!(varint(&[0x41, 0x02]), 1 + (2 << 6));
        assert_eq!(signed_varint(&[0x06]), 3);
        assert_eq!(signed_varint(&[0x07]), -3);
    }

    #[test]
    fn pep626_pairs() {
        // 4 bytes on line 11, 2 bytes without a line, a line-only move of +2, then 6 bytes on 14.
        let table = [4, 1, 2, 0x80, 0, 2, 6, 1];
        let r = ranges(LineTableFormat::Pep626, &table, 10);
        assert_eq!(
            r,
            vec![
                LineRange {
                    start: 0,
                    end: 4,
                    line: Some(11)
                },
                LineRange {
                    start: 4,
                    end: 6,
                    line: None
                },
                LineRange {
                    start: 6,
                    end: 12,
                    line: Some(14)
                },
            ]
        );
        assert_eq!(
            line_for_offset(LineTableFormat::Pep626, &table, 10, 8),
            Some(14)
        );
        assert_eq!(
            line_for_offset(LineTableFormat::Pep626, &table, 10, 12),
            None
        );
    }

    #[test]
    fn location_entries() {
        // Kind 13 (no columns) +1 over 1 unit; kind 15 (none) over 2 units; kind 11 (one line,
        // +1) over 1 unit with two column bytes; kind 0 (short) over 3 units with one byte.
        let table = [
            0x80 | (13 << 3),
            0x02,
            0x80 | (15 << 3) | 1,
            0x80 | (11 << 3),
            4,
            9,
            0x80 | 2,
            0x11,
        ];
        let r = ranges(LineTableFormat::Locations, &table, 1);
        let lines: Vec<_> = r.iter().map(|r| (r.start, r.end, r.line)).collect();
        assert_eq!(
            lines,
            vec![
                (0, 2, Some(2)),
                (2, 6, None),
                (6, 8, Some(3)),
                (8, 14, Some(3))
            ]
        );
    }

    /// Dumps, for every code object compiled from a few stdlib modules and from generated code
    /// with long line jumps, its first line, `co_linetable` and the line `co_lines()` gives
    /// each instruction (None where no range covers it).
    const DUMP_LINE_TABLES: &str = r#"
import json, os, sys, sysconfig

def walk(code):
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from walk(c)

stdlib = sysconfig.get_paths()["stdlib"]
sources = [
    (p, open(p, encoding="utf-8").read())
    for p in (os.path.join(stdlib, m) for m in (
        "threading.py", "argparse.py", "dataclasses.py", "json/decoder.py",
        "asyncio/base_events.py", "inspect.py"))
]
gap = "\n" * 300
generated = (
    "def far(x):\n"
    "    a = 1" + gap + "    b = 2\n"
    "    for i in range(x):\n"
    "        if i:" + gap + "            continue\n"
    "    return (a +\n" + gap + "        b)\n"
    "async def agen():\n    yield 1\n    await far(2)\n"
    "def tricky():\n    try:\n        pass\n    finally:\n        x = [\n            1,\n            2]\n"
    "lam = lambda: (yield)\n"
)
sources.append(("<generated>", generated))
out = []
for path, src in sources:
    for co in walk(compile(src, path, "exec")):
        n = len(co.co_code) // 2
        lines = [None] * n
        for start, end, line in co.co_lines():
            for unit in range(start // 2, min(end // 2, n)):
                lines[unit] = line
        out.append({"first": co.co_firstlineno, "table": co.co_linetable.hex(), "lines": lines})
print(json.dumps(out))
"#;

    /// The decoders agree with each real interpreter's `co_lines()` on every instruction of
    /// every code object of the dump above.
    #[test]
    fn decoders_agree_with_cpython() {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let interpreters = [
            (
                format!("{home}/.pyenv/versions/3.10.13/bin/python3"),
                LineTableFormat::Pep626,
            ),
            (
                format!("{home}/.pyenv/versions/3.11.7/bin/python3"),
                LineTableFormat::Locations,
            ),
            (
                format!("{home}/.pyenv/versions/3.12.1/bin/python3"),
                LineTableFormat::Locations,
            ),
            (
                format!("{home}/.pyenv/versions/3.13.0/bin/python3"),
                LineTableFormat::Locations,
            ),
            (
                "/usr/bin/python3.11".to_string(),
                LineTableFormat::Locations,
            ),
        ];
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        for (python, format) in interpreters {
            if !std::path::Path::new(&python).exists() {
                assert!(!ci, "{python} is needed under CI");
                eprintln!("skipping {python}: not installed");
                continue;
            }
            let out = std::process::Command::new(&python)
                .args(["-c", DUMP_LINE_TABLES])
                .output()
                .expect("run python");
            assert!(
                out.status.success(),
                "{python}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let codes: Vec<serde_json::Value> =
                serde_json::from_slice(&out.stdout).expect("json from the dump");
            let mut checked = 0;
            for code in &codes {
                let first = code["first"].as_u64().expect("first line") as u32;
                let hex = code["table"].as_str().expect("table");
                let table: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                    .collect();
                let ranges = ranges(format, &table, first);
                for (unit, want) in code["lines"].as_array().expect("lines").iter().enumerate() {
                    let addr = unit as u32 * CODE_UNIT;
                    let got = ranges
                        .iter()
                        .find(|r| r.start <= addr && addr < r.end)
                        .and_then(|r| r.line);
                    assert_eq!(
                        got,
                        want.as_u64().map(|l| l as u32),
                        "{python}: code starting at line {first}, byte offset {addr}, table {hex}"
                    );
                    checked += 1;
                }
            }
            assert!(
                codes.len() > 500 && checked > 20_000,
                "{python}: a real sample"
            );
            eprintln!(
                "{python}: {} code objects, {checked} instructions agree",
                codes.len()
            );
        }
    }
}
