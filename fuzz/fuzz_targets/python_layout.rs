//! CPython 3.13+'s self-description, `_Py_DebugOffsets`, read from the start of the target's
//! `_PyRuntime`: every offset bpfprof then reads the target's memory at comes from it.
#![no_main]

use bpfprof::runtime::cpython::layout::Layout;
use libfuzzer_sys::fuzz_target;

/// The offsets a layout may hold: [`Layout::from_debug_offsets`] refuses larger ones, so that
/// no read of a CPython object starts megabytes past it.
const MAX_OFFSET: u32 = 1 << 24;

fuzz_target!(|data: &[u8]| {
    // The interpreter's own version, which the blob must match: taken from the blob's version
    // word (after the 8-byte cookie), so that inputs reach the offsets' checks.
    let expected = match data.get(8..16) {
        Some(word) => {
            let hex = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
            (((hex >> 24) & 0xff) as u8, ((hex >> 16) & 0xff) as u8)
        }
        None => (3, 13),
    };
    let Ok(layout) = Layout::from_debug_offsets(data, expected) else {
        return;
    };
    let offsets = [
        layout.runtime_interpreters_head,
        layout.interp_next,
        layout.interp_threads_head,
        layout.tstate_next,
        layout.tstate_thread_id,
        layout.code_filename,
        layout.code_name,
        layout.code_firstlineno,
        layout.code_linetable,
        layout.object_type,
        layout.type_name,
        layout.unicode_length,
        layout.unicode_state,
        layout.unicode_ascii_size,
        layout.unicode_compact_size,
        layout.bytes_size,
        layout.bytes_data,
        layout.kernel.tstate_frame,
        layout.kernel.frame_previous,
        layout.kernel.frame_code,
        layout.kernel.frame_instr,
        layout.kernel.frame_entry,
        layout.kernel.code_instructions,
    ];
    for offset in offsets {
        assert!(offset < MAX_OFFSET + 16, "offset {offset:#x} in {layout:?}");
    }
});
