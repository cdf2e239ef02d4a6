//! CPython's line tables (`co_linetable`, read from the target's memory) decoded in both
//! formats: 3.10's PEP 626 pairs and 3.11+'s location table.
//!
//! Input: byte 0 picks the format (bit 0: location table), bytes 1..5 the first line
//! (u32, little-endian), the rest is the table.
#![no_main]

use bpfprof::runtime::cpython::{
    code::CodeInfo,
    linetable::{line_for_offset, ranges, LineTableFormat},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((header, table)) = data.split_at_checked(5) else {
        return;
    };
    let format = if header[0] & 1 != 0 {
        LineTableFormat::Locations
    } else {
        LineTableFormat::Pep626
    };
    let first_line = u32::from_le_bytes(header[1..5].try_into().expect("4 bytes"));
    let lines = ranges(format, table, first_line);
    // Every range comes from at least one byte of the table, and they tile the code from 0.
    assert!(lines.len() <= table.len());
    let mut end = 0;
    for r in &lines {
        assert!(r.start == end && r.start < r.end, "ranges {lines:?}");
        end = r.end;
    }
    // The lookup the symbolizer uses (a bisection over the ranges, by instruction index)
    // agrees with the walk CPython's `PyCode_Addr2Line` does, at every range's edges (at the
    // instructions there: a hostile PEP 626 table may cut ranges at odd bytes).
    let code = CodeInfo {
        name: String::new(),
        file: String::new(),
        first_line,
        lines,
        identity: [0; 6],
        identity_bits: 0,
    };
    for r in code.lines.iter().take(64) {
        for addr in [r.start, r.end.saturating_sub(1), r.end].map(|a| a & !1) {
            let walked = line_for_offset(format, table, first_line, addr).unwrap_or(first_line);
            assert_eq!(code.line(addr / 2), walked, "at byte {addr}");
        }
    }
});
