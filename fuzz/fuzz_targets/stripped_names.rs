//! Names for code no symbol covers (`symbolize::stripped`), as the daemon reads a target's
//! stripped libraries: the ELF headers, `.eh_frame_hdr`'s table of function starts and the
//! exported symbols behind a `module+0xSTART` or `export+0xOFF` name, and the decoding of the
//! exports' jumps that finds their split-off `.cold` parts.
#![no_main]

use bpfprof::symbolize::stripped::{FunctionStarts, MAX_NAME_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(starts) = FunctionStarts::parse(data) else {
        return;
    };
    let _ = starts.find_parts(data);
    // Offsets across the file and at the edges of the address space: a name, where there is
    // one, is never empty, and its function's part within the bound (`…`, `.cold` or
    // `+0x...` past it).
    let len = data.len() as u64;
    let step = (len / 61).max(1);
    let edges = [len, len + 1, u64::MAX, u64::MAX - 1, 1 << 63];
    for offset in (0..len).step_by(step as usize).chain(edges) {
        if let Some(name) = starts.name("fuzz.so", offset) {
            assert!(!name.is_empty());
            assert!(name.len() <= MAX_NAME_BYTES + 32, "{} bytes", name.len());
        }
    }
});
