//! The unwind-table builder on whole ELF images, as the daemon reads a target's mapped files:
//! the ELF headers, `.eh_frame` through `.eh_frame_hdr`'s search table, bare `.eh_frame`, or
//! `.debug_frame`; and the row estimate and load bias read from the same headers.
#![no_main]

use bpfprof::unwind::table::{estimate_rows, load_bias, UnwindTable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The estimate sizes the kernel's row array before any build: it must not be fooled into
    // more than the CFI's bytes could describe.
    assert!(estimate_rows(data) <= data.len() as u64);
    let _ = load_bias(data, 0x7f12_3456_7000, 0x1000);
    if let Ok((table, _source)) = UnwindTable::from_elf(data) {
        bpfprof_fuzz::check_table(&table, data.len());
    }
});
