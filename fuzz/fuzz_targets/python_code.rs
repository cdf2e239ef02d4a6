//! CPython code objects, `str` and `bytes` objects read out of a target's memory, as the
//! daemon names Python frames: the reads go through the real `ProcessMemory` (this process's
//! own memory), from an image of the target's memory that the fuzzer writes.
//!
//! Input: byte 0 picks the CPython version whose layout is used (3.10 to 3.13, by
//! `byte % 4`); the rest is mapped at `IMAGE_BASE`, where the code object is read. The
//! pointers inside the image (to the code's type, names, file and line table) are addresses
//! in that mapping, so the fuzzer can build any structure there, cyclic ones included.
#![no_main]

use bpfprof::runtime::cpython::code::CodeReader;
use bpfprof_fuzz::{python_image, IMAGE_BASE};
use libfuzzer_sys::fuzz_target;

/// Characters a name is cut at ([`bpfprof::runtime::cpython::code`] reads no more), times the UTF-8
/// bytes one may take.
const MAX_NAME_BYTES: usize = 4096 * 4;

fuzz_target!(|data: &[u8]| {
    let Some((layout, _image, mem)) = python_image(data) else {
        return;
    };
    let mut reader = CodeReader::default();
    // Twice: the second read goes through the reader's caches (the code type, file names).
    for _ in 0..2 {
        let Ok(code) = reader.read_code(&mem, &layout, IMAGE_BASE as u64) else {
            return;
        };
        assert!(code.name.len() <= MAX_NAME_BYTES && code.file.len() <= MAX_NAME_BYTES);
        // The line table is a bytes object of the image (or refused as too large): its ranges
        // are bounded by the table's size, itself bounded by the reader's cap.
        assert!(code.lines.len() <= 1 << 20);
        for index in [0, 1, u32::MAX] {
            let _ = code.line(index);
        }
    }
});
