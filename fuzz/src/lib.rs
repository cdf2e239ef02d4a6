//! What bpfprof's fuzz targets share: the properties every unwind table must have, whatever
//! bytes it was built from, the wrapping of bare CFI sections into an ELF object, and the
//! image of a CPython process's memory that the Python targets read.

use bpfprof::unwind::table::UnwindTable;
use object::write::elf::{FileHeader, SectionHeader, Writer};

/// Rows a table may have per byte of input, at most. Every row of a table starts at a distinct
/// pc that one CFA instruction (at least one byte of CFI) or one FDE (at least 16 bytes)
/// introduced, so a table with more rows than its input has bytes made rows out of nothing:
/// the blow-up of issue 23 item 6 (3 GB from a 620 KB file) broke exactly this.
pub const ROWS_PER_INPUT_BYTE: usize = 1;

/// Rows allowed whatever the input's size (a tiny object's closing rows).
pub const ROW_SLACK: usize = 16;

/// Asserts what the kernel walk relies on and what the daemon's memory relies on: the rows
/// are sorted by strictly increasing pc, no two neighbours hold the same rule, and there are
/// no more of them than the input could describe.
pub fn check_table(table: &UnwindTable, input_len: usize) {
    let rows = &table.rows;
    assert!(
        rows.len() <= input_len * ROWS_PER_INPUT_BYTE + ROW_SLACK,
        "{} rows from {input_len} bytes",
        rows.len()
    );
    for pair in rows.windows(2) {
        assert!(pair[0].pc < pair[1].pc, "rows out of order: {pair:?}");
        assert!(
            (pair[0].cfa_offset, pair[0].info) != (pair[1].cfa_offset, pair[1].info),
            "two neighbours alike: {pair:?}"
        );
    }
}

/// How `unwind_cfi` reads its input: a fixed header, then `.eh_frame_hdr`'s bytes, then the
/// CFI section's (`.eh_frame`, or `.debug_frame` with [`CFI_IS_DEBUG_FRAME`]).
///
/// | bytes  | field                                                        |
/// |--------|--------------------------------------------------------------|
/// | 0      | flags: [`HAS_EH_FRAME_HDR`], [`CFI_IS_DEBUG_FRAME`]          |
/// | 1..5   | `.text` address (u32, little-endian)                         |
/// | 5..9   | `.text` size (no bytes in the file: `SHT_NOBITS`)            |
/// | 9..13  | the CFI section's address                                    |
/// | 13..17 | `.eh_frame_hdr`'s address                                    |
/// | 17..19 | `.eh_frame_hdr`'s length (u16)                               |
pub const CFI_HEADER_LEN: usize = 19;

/// Flag: the object has an `.eh_frame_hdr` (the builder then walks its search table).
pub const HAS_EH_FRAME_HDR: u8 = 1;

/// Flag: the CFI is `.debug_frame` (what objects built without `.eh_frame` carry).
pub const CFI_IS_DEBUG_FRAME: u8 = 2;

/// The sections `unwind_cfi` reads, as laid out in its input (see [`CFI_HEADER_LEN`]).
pub struct CfiInput<'a> {
    /// The header's flags.
    pub flags: u8,
    /// `.text`'s address and size.
    pub text: (u32, u32),
    /// The CFI section's address and bytes.
    pub cfi: (u32, &'a [u8]),
    /// `.eh_frame_hdr`'s address and bytes.
    pub hdr: (u32, &'a [u8]),
}

impl<'a> CfiInput<'a> {
    /// Splits a fuzz input; `None` when it is shorter than its header says.
    pub fn parse(data: &'a [u8]) -> Option<CfiInput<'a>> {
        let header = data.get(..CFI_HEADER_LEN)?;
        let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4"));
        let hdr_len = usize::from(u16::from_le_bytes([header[17], header[18]]));
        let rest = &data[CFI_HEADER_LEN..];
        let (hdr, cfi) = (rest.get(..hdr_len)?, &rest[hdr_len..]);
        Some(CfiInput {
            flags: header[0],
            text: (u32_at(1), u32_at(5)),
            cfi: (u32_at(9), cfi),
            hdr: (u32_at(13), hdr),
        })
    }

    /// An x86-64 shared object holding these sections at these addresses.
    pub fn to_elf(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = Writer::new(object::Endianness::Little, true, &mut out);
        w.reserve_file_header();
        let cfi_name: &[u8] = if self.flags & CFI_IS_DEBUG_FRAME != 0 {
            b".debug_frame"
        } else {
            b".eh_frame"
        };
        let has_hdr = self.flags & HAS_EH_FRAME_HDR != 0;
        let text_name = w.add_section_name(b".text");
        let cfi_name = w.add_section_name(cfi_name);
        let hdr_name = has_hdr.then(|| w.add_section_name(b".eh_frame_hdr"));
        w.reserve_null_section_index();
        w.reserve_section_index();
        w.reserve_section_index();
        if has_hdr {
            w.reserve_section_index();
        }
        w.reserve_shstrtab_section_index();
        let cfi_offset = w.reserve(self.cfi.1.len(), 8);
        let hdr_offset = w.reserve(self.hdr.1.len(), 4);
        w.reserve_shstrtab();
        w.reserve_section_headers();

        w.write_file_header(&FileHeader {
            os_abi: 0,
            abi_version: 0,
            e_type: object::elf::ET_DYN,
            e_machine: object::elf::EM_X86_64,
            e_entry: 0,
            e_flags: 0,
        })
        .expect("a valid header");
        w.write_align(8);
        w.write(self.cfi.1);
        w.write_align(4);
        w.write(self.hdr.1);
        w.write_shstrtab();
        w.write_null_section_header();
        let alloc = u64::from(object::elf::SHF_ALLOC);
        w.write_section_header(&SectionHeader {
            name: Some(text_name),
            sh_type: object::elf::SHT_NOBITS,
            sh_flags: alloc | u64::from(object::elf::SHF_EXECINSTR),
            sh_addr: self.text.0.into(),
            sh_offset: 0,
            sh_size: self.text.1.into(),
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 16,
            sh_entsize: 0,
        });
        w.write_section_header(&SectionHeader {
            name: Some(cfi_name),
            sh_type: object::elf::SHT_PROGBITS,
            sh_flags: if self.flags & CFI_IS_DEBUG_FRAME != 0 {
                0
            } else {
                alloc
            },
            sh_addr: self.cfi.0.into(),
            sh_offset: cfi_offset as u64,
            sh_size: self.cfi.1.len() as u64,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 8,
            sh_entsize: 0,
        });
        if let Some(name) = hdr_name {
            w.write_section_header(&SectionHeader {
                name: Some(name),
                sh_type: object::elf::SHT_PROGBITS,
                sh_flags: alloc,
                sh_addr: self.hdr.0.into(),
                sh_offset: hdr_offset as u64,
                sh_size: self.hdr.1.len() as u64,
                sh_link: 0,
                sh_info: 0,
                sh_addralign: 4,
                sh_entsize: 0,
            });
        }
        w.write_shstrtab_section_header();
        out
    }
}

/// Where the Python targets map their image of a target's memory: a fixed address, so that
/// the corpus's pointers stay valid, far from where Linux puts the fuzzer's own heap, stacks
/// and libraries (`fuzz/seed.py`'s `IMAGE_BASE`).
pub const IMAGE_BASE: usize = 0x2000_0000_0000;

/// `_Py_DebugOffsets` of a real CPython 3.13.0 (the `python_layout` seed), for 3.13's layout.
const DEBUG_OFFSETS_3_13: &[u8] = include_bytes!("../corpus/python_layout/cpython-3.13.0");

/// An input of the Python targets: its first byte picks the CPython version whose layout is
/// used (3.10 to 3.13, by `byte % 4`), the rest is the image mapped at [`IMAGE_BASE`] (kept
/// while the returned [`Image`] lives), read through this process's memory; `None` for an
/// empty input.
pub fn python_image(
    data: &[u8],
) -> Option<(
    bpfprof::runtime::cpython::layout::Layout,
    Image,
    bpfprof::runtime::cpython::memory::ProcessMemory,
)> {
    use bpfprof::runtime::cpython::layout;
    let (&version, image) = data.split_first()?;
    let layout = match version % 4 {
        3 => {
            // The corpus holds the struct's 584 bytes; bpfprof reads a fixed span of
            // `_PyRuntime` (the larger 3.14/3.15 structs), which follows it in a real process.
            let mut raw = DEBUG_OFFSETS_3_13.to_vec();
            raw.resize(4096, 0);
            layout::Layout::from_debug_offsets(&raw, (3, 13)).expect("a real 3.13")
        }
        minor => layout::table(10 + minor).expect("3.10 to 3.12 are tabled"),
    };
    let memory = bpfprof::runtime::cpython::memory::ProcessMemory::new(std::process::id());
    Some((layout, Image::map(image), memory))
}

/// Bytes mapped at [`IMAGE_BASE`] for one input, where the daemon's readers of a target's
/// memory (`ProcessMemory` of this process) find them; unmapped when dropped.
pub struct Image {
    len: usize,
}

impl Image {
    /// Maps `bytes` at [`IMAGE_BASE`].
    pub fn map(bytes: &[u8]) -> Image {
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
