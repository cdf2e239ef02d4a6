//! The parser of the perf maps JIT compilers write (`/tmp/perf-PID.map`), a file the target
//! controls wholly, as the daemon reads it (lossily as UTF-8).
#![no_main]

use bpfprof::process::maps::parse_perf_map;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let symbols = parse_perf_map(&text);
    // One symbol per line at most, and no name larger than its line: the output is bounded
    // by the input.
    assert!(symbols.len() <= text.lines().count());
    let names: usize = symbols.iter().map(|s| s.name.len()).sum();
    assert!(names <= text.len());
    for s in &symbols {
        assert!(s.start < s.end, "an empty or inverted symbol: {s:?}");
        assert!(
            !s.name.is_empty() && s.name.trim() == s.name,
            "name {:?}",
            s.name
        );
    }
    assert!(
        symbols.windows(2).all(|w| w[0].start <= w[1].start),
        "symbols out of order"
    );
});
