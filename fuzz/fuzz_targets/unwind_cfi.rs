//! The unwind-table builder on CFI sections the fuzzer writes directly (see
//! `bpfprof_fuzz::CfiInput`), wrapped into a well-formed ELF object: the fuzzer's mutations
//! then reach `.eh_frame`, `.eh_frame_hdr` and `.debug_frame` instead of breaking the ELF
//! headers around them.
#![no_main]

use bpfprof::unwind::table::UnwindTable;
use bpfprof_fuzz::CfiInput;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(input) = CfiInput::parse(data) else {
        return;
    };
    let elf = input.to_elf();
    if let Ok((table, _source)) = UnwindTable::from_elf(elf.as_slice()) {
        // Bounded by the CFI's own bytes, not by the ELF wrapping's.
        bpfprof_fuzz::check_table(&table, input.cfi.1.len() + input.hdr.1.len());
    }
});
