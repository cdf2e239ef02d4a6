//! How big an object's table will be (estimated from its CFI's size, before building) and
//! where its code is mapped (the load bias).

use std::path::Path;

use anyhow::{anyhow, Context};

/// Bytes of call frame information per table row, at least: measured 5.4-6.8 on libc,
/// CPython, libc10, libtorch_python, libtorch_cpu and libtorch_cuda (the smallest ratio
/// gives the most rows, so the estimate errs on the side of room).
pub(super) const CFI_BYTES_PER_ROW: u64 = 5;

/// The rows the table of the ELF image `data` will have, estimated from the size of its
/// call frame information without evaluating it (microseconds instead of a build).
pub fn estimate_rows<'data>(data: impl object::ReadRef<'data>) -> u64 {
    // The section headers alone: `object::File::parse` would also read the whole symbol
    // table, megabytes for a large library, for each new object a system-wide run meets.
    let sections = match object::FileKind::parse(data) {
        Ok(object::FileKind::Elf64) => section_sizes::<object::elf::FileHeader64<_>>(data),
        Ok(object::FileKind::Elf32) => section_sizes::<object::elf::FileHeader32<_>>(data),
        _ => None,
    };
    let Some(size) = sections else {
        return 0;
    };
    let cfi = match size[0] {
        0 => size[1],
        n => n,
    };
    cfi / CFI_BYTES_PER_ROW
}

/// The bytes `.eh_frame` and `.debug_frame` have in the file `data` (0 for one it lacks).
pub(super) fn section_sizes<
    'data,
    Elf: object::read::elf::FileHeader<Endian = object::Endianness>,
>(
    data: impl object::ReadRef<'data>,
) -> Option<[u64; 2]> {
    use object::read::elf::SectionHeader as _;
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let file_len = data.len().unwrap_or(0);
    // The bytes the section has in the file: a header claiming more (4 GiB of `.eh_frame` in
    // a 4 KiB file) sized the kernel's row array at its cap.
    let size = |name: &[u8]| {
        sections
            .section_by_name(endian, name)
            .and_then(|(_, s)| s.file_range(endian))
            .filter(|&(offset, size)| offset.saturating_add(size) <= file_len)
            .map_or(0, |(_, size)| size)
    };
    Some([size(b".eh_frame"), size(b".debug_frame")])
}

/// The rows the tables of every object process `pid` maps executable will have, estimated;
/// 0 when its memory map cannot be read.
pub fn estimate_process_rows(pid: u32) -> u32 {
    let Ok(maps) = procfs::process::Process::new(pid as i32).and_then(|p| p.maps()) else {
        return 0;
    };
    let mut seen = std::collections::HashSet::new();
    let mut rows = 0u64;
    for map in maps.0 {
        let procfs::process::MMapPath::Path(_) = &map.pathname else {
            continue;
        };
        if !map.perms.contains(procfs::process::MMPermissions::EXECUTE)
            || !seen.insert((map.dev, map.inode))
        {
            continue;
        }
        let (start, end) = map.address;
        let source = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
        let Ok((file, _)) = crate::process::target_file::open_proc_link(Path::new(&source)) else {
            continue;
        };
        rows += estimate_rows(&crate::process::target_file::ElfReader::new(file));
    }
    rows.min(u64::from(u32::MAX)) as u32
}

/// The load bias of the mapping at `start` with file `offset`: runtime address minus the
/// object's virtual address, from the PT_LOAD segment that holds `offset`.
pub fn load_bias<'data>(
    data: impl object::ReadRef<'data>,
    start: u64,
    offset: u64,
) -> anyhow::Result<u64> {
    // The program headers alone: `object::File::parse` would also read the whole symbol
    // table (a third of a system-wide agent's CPU went there, for each object of each new
    // process).
    let segments = match object::FileKind::parse(data).context("parsing the ELF headers")? {
        object::FileKind::Elf64 => load_segments::<object::elf::FileHeader64<_>>(data),
        object::FileKind::Elf32 => load_segments::<object::elf::FileHeader32<_>>(data),
        kind => return Err(anyhow!("not an ELF file ({kind:?})")),
    }
    .context("parsing the ELF headers")?;
    let bias = |file_start: u64, vaddr: u64| {
        // runtime = start + (file position - offset); vaddr = p_vaddr + (file position - p_offset)
        start
            .wrapping_sub(offset)
            .wrapping_add(file_start)
            .wrapping_sub(vaddr)
    };
    // The kernel maps a segment from the page its p_offset is in. Segments share pages at
    // their edges, so the page of a mapping's offset can also lie inside the segment before
    // it (Rust and lld binaries put .text right after read-only data, with p_vaddr - p_offset
    // differing between the two): the segment that starts in that page is the one mapped.
    let page = |x: u64| x & !(PAGE_SIZE - 1);
    // Two segments may start in one page (read-only data, then writable data): the executable
    // one is the one the unwinder asks about.
    if let Some(segment) = segments
        .iter()
        .filter(|s| page(s.file_start) == page(offset))
        .max_by_key(|s| s.executable)
    {
        return Ok(bias(segment.file_start, segment.vaddr));
    }
    for segment in &segments {
        // Headers are the target's: p_offset + p_filesz may pass 2^64 (the fuzzer's find).
        if offset
            .checked_sub(segment.file_start)
            .is_some_and(|into| into < segment.file_size.max(1))
        {
            return Ok(bias(segment.file_start, segment.vaddr));
        }
    }
    Err(anyhow!("no PT_LOAD segment holds file offset {offset:#x}"))
}

/// A `PT_LOAD` segment, as [`load_bias`] needs it.
pub(super) struct LoadSegment {
    file_start: u64,
    file_size: u64,
    vaddr: u64,
    executable: bool,
}

/// The `PT_LOAD` segments of the ELF file `data`, from its program headers.
pub(super) fn load_segments<
    'data,
    Elf: object::read::elf::FileHeader<Endian = object::Endianness>,
>(
    data: impl object::ReadRef<'data>,
) -> object::read::Result<Vec<LoadSegment>> {
    use object::read::elf::ProgramHeader as _;
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    Ok(header
        .program_headers(endian, data)?
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| LoadSegment {
            file_start: p.p_offset(endian).into(),
            file_size: p.p_filesz(endian).into(),
            vaddr: p.p_vaddr(endian).into(),
            executable: p.p_flags(endian) & object::elf::PF_X != 0,
        })
        .collect())
}

/// The page size of x86-64, the unit in which segments are mapped.
pub(super) const PAGE_SIZE: u64 = 4096;
