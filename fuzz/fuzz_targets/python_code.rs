//! CPython code objects, `str` and `bytes` objects read out of a target's memory, as the
//! daemon names Python frames: the reads go through the real `ProcessMemory` (this process's
//! own memory), from an image of the target's memory that the fuzzer writes.
//!
//! Input: byte 0 picks the CPython version whose layout is used (3.10 to 3.13, by
//! `byte % 4`); the rest is mapped at [`IMAGE_BASE`], where the code object is read. The
//! pointers inside the image (to the code's type, names, file and line table) are addresses
//! in that mapping, so the fuzzer can build any structure there, cyclic ones included.
#![no_main]

use bpfprof::python::{code::CodeReader, layout, memory::ProcessMemory};
use libfuzzer_sys::fuzz_target;

/// Where the image is mapped: a fixed address, so that the corpus's pointers stay valid, far
/// from where Linux puts the fuzzer's own heap, stacks and libraries.
const IMAGE_BASE: usize = 0x2000_0000_0000;

/// `_Py_DebugOffsets` of a real CPython 3.13.0 (the `python_layout` seed), for 3.13's layout.
const DEBUG_OFFSETS_3_13: &[u8] = include_bytes!("../corpus/python_layout/cpython-3.13.0");

/// Characters a name is cut at ([`bpfprof::python::code`] reads no more), times the UTF-8
/// bytes one may take.
const MAX_NAME_BYTES: usize = 4096 * 4;

/// The image mapped at [`IMAGE_BASE`] for one input, unmapped when dropped.
struct Image {
    len: usize,
}

impl Image {
    fn map(bytes: &[u8]) -> Image {
        let len = bytes.len().max(1).next_multiple_of(4096);
        // SAFETY: a fresh private anonymous mapping at an address nothing else uses
        // (MAP_FIXED_NOREPLACE fails rather than replace a mapping), written only here.
        unsafe {
            let at = libc::mmap(
                IMAGE_BASE as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            assert_eq!(at as usize, IMAGE_BASE, "mapping the image");
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.cast(), bytes.len());
        }
        Image { len }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no reference into it outlives `self`.
        unsafe { libc::munmap(IMAGE_BASE as *mut libc::c_void, self.len) };
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&version, image)) = data.split_first() else {
        return;
    };
    let layout = match version % 4 {
        3 => layout::Layout::from_debug_offsets(DEBUG_OFFSETS_3_13).expect("a real 3.13"),
        minor => layout::table(10 + minor).expect("3.10 to 3.12 are tabled"),
    };
    let _image = Image::map(image);
    let mem = ProcessMemory::new(std::process::id());
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
