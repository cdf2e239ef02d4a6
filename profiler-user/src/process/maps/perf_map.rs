//! Symbols a JIT announces in its perf map (`/tmp/perf-PID.map`).

/// A symbol a JIT compiler announced in its perf map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitSymbol {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// The name, as the JIT wrote it.
    pub name: String,
}

/// Parses the perf map format JITs write (`START SIZE NAME`, hex numbers, one symbol a line;
/// see linux `tools/perf/Documentation/jit-interface.txt`). Malformed lines are skipped.
/// Public so that the `perf_map` fuzz target runs the very parser the daemon does.
pub fn parse_perf_map(text: &str) -> Vec<JitSymbol> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut symbols: Vec<JitSymbol> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.trim().splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            let name = parts.next()?.trim();
            // A range past the end of the address space is malformed too (saturating it left
            // an empty symbol behind, found by the `perf_map` fuzz target).
            let end = start.checked_add(size)?;
            (!name.is_empty() && size > 0).then(|| JitSymbol {
                start,
                end,
                name: name.to_string(),
            })
        })
        .collect();
    symbols.sort_by_key(|s| s.start);
    symbols
}
