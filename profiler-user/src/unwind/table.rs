//! Turns an ELF object's call frame information (`.eh_frame`, else `.debug_frame`) into the
//! compact, address-sorted rows the kernel program's CFI walk reads.
//!
//! Each FDE's rows are evaluated by gimli; each row is reduced to the three things the walk
//! needs on x86-64: how to compute the CFA, where the return address is, and where the
//! caller's rbp is. Rules the walk cannot evaluate become [`CfaRule::NoInfo`] rows, so that
//! frame falls back to the frame pointer instead of producing garbage.

use std::{path::Path, time::Duration};

use anyhow::{anyhow, Context};
use gimli::{
    BaseAddresses, CfaRule as GimliCfa, CieOrFde, DebugFrame, EhFrame, EhFrameHdr, LittleEndian,
    RegisterRule, UnwindContext, UnwindSection, X86_64,
};
use object::{Object, ObjectSection, ObjectSegment};
use profiler_common::{CfaRule, UnwindRow, RETURN_ADDRESS_OFFSET};

use crate::clock::thread_cpu_time;

/// The gimli reader over a mapped ELF image.
type Slice<'a> = gimli::EndianSlice<'a, LittleEndian>;

/// The unwind rows of one object, sorted by `pc`, with no two neighbours alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwindTable {
    /// The rows; each holds from its `pc` to the next row's.
    pub rows: Vec<UnwindRow>,
}

/// Where the CFI came from, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfiSource {
    /// `.eh_frame`, located through `.eh_frame_hdr`.
    EhFrameHdr,
    /// `.eh_frame` without a `.eh_frame_hdr`.
    EhFrame,
    /// `.debug_frame`, when the object has no `.eh_frame`.
    DebugFrame,
    /// No CFI at all: every frame in this object unwinds by frame pointer.
    None,
}

impl UnwindTable {
    /// Builds the table of the ELF file at `path`, read by `pread` (see
    /// [`crate::process::target_file::ElfReader`]).
    pub fn from_path(path: &Path) -> anyhow::Result<(UnwindTable, CfiSource)> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let reader = crate::process::target_file::ElfReader::new(file);
        Self::from_elf(&reader)
            .map_err(|e| reader.explain(e))
            .with_context(|| format!("reading the CFI of {}", path.display()))
    }

    /// Builds the table of an ELF image: in memory, or read on demand from a file.
    pub fn from_elf<'data>(
        data: impl object::ReadRef<'data>,
    ) -> anyhow::Result<(UnwindTable, CfiSource)> {
        let elf = object::File::parse(data).context("parsing the ELF headers")?;
        CfiInputs::read(&elf)?.build()
    }

    /// The row that holds at ELF virtual address `pc`, if any.
    pub fn lookup(&self, pc: u64) -> Option<&UnwindRow> {
        let pc = u32::try_from(pc).ok()?;
        let i = self.rows.partition_point(|r| r.pc <= pc);
        i.checked_sub(1).map(|i| &self.rows[i])
    }

    /// Bytes the rows take (in userspace and in the kernel's row array alike).
    pub fn bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<UnwindRow>()
    }
}

/// Everything of an ELF object that its table is made from, and nothing else: the table is
/// a function of these alone (see [`Self::build`]), so their hash ([`Self::key`]) names the
/// table in the on-disk cache ([`super::cache`]) and a rebuilt object at the same path, whose
/// call frame information or addresses changed, can never get the old table.
pub struct CfiInputs<'data> {
    /// The most rows the table may have (see [`row_limit`]).
    row_limit: usize,
    /// The address of `.text`, for `DW_EH_PE_textrel` pointers.
    text: Option<u64>,
    /// The address of `.got`, for `DW_EH_PE_datarel` pointers.
    got: Option<u64>,
    /// `.eh_frame`'s address and bytes.
    eh_frame: Option<(u64, &'data [u8])>,
    /// `.eh_frame_hdr`'s address and bytes.
    eh_frame_hdr: Option<(u64, &'data [u8])>,
    /// `.debug_frame`'s bytes, read only when the object has no `.eh_frame`.
    debug_frame: Option<&'data [u8]>,
}

/// Version of the table format and of the rules that make rows from CFI: part of every
/// [`CfiInputs::key`], so that a bpfprof whose builder differs never reads another's tables
/// (the executable's own build id is part of the key as well; see [`super::cache`]).
const TABLE_FORMAT: u32 = 1;

impl<'data> CfiInputs<'data> {
    /// Reads the inputs of `elf`'s table (an x86-64 object's; any other is an error).
    pub fn read<R: object::ReadRef<'data>>(
        elf: &object::File<'data, R>,
    ) -> anyhow::Result<CfiInputs<'data>> {
        if elf.architecture() != object::Architecture::X86_64 {
            return Err(anyhow!(
                "CFI unwinding supports x86-64 only, not {:?}",
                elf.architecture()
            ));
        }
        let section = |name: &str| {
            elf.section_by_name(name)
                .and_then(|s| Some((s.address(), s.data().ok()?)))
                .filter(|(_, d)| !d.is_empty())
        };
        let eh_frame = section(".eh_frame");
        Ok(CfiInputs {
            row_limit: row_limit(elf),
            text: elf.section_by_name(".text").map(|s| s.address()),
            got: elf.section_by_name(".got").map(|s| s.address()),
            eh_frame,
            eh_frame_hdr: eh_frame.and_then(|_| section(".eh_frame_hdr")),
            debug_frame: match eh_frame {
                Some(_) => None,
                None => section(".debug_frame").map(|(_, d)| d),
            },
        })
    }

    /// A hash of every input and of `salt` (what else the table depends on: the builder's
    /// identity), naming the table these inputs make.
    pub fn key(&self, salt: &[u8]) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        // Each field with its tag and length, so that no two different inputs hash alike.
        let mut field = |tag: u8, bytes: &[u8]| {
            h.update([tag]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(0, &TABLE_FORMAT.to_le_bytes());
        field(1, salt);
        field(2, &(self.row_limit as u64).to_le_bytes());
        let opt = |v: Option<u64>| {
            v.map_or([0; 9], |v| {
                let mut b = [1; 9];
                b[1..].copy_from_slice(&v.to_le_bytes());
                b
            })
        };
        field(3, &opt(self.text));
        field(4, &opt(self.got));
        for (tag, section) in [(5, self.eh_frame), (7, self.eh_frame_hdr)] {
            field(tag, &opt(section.map(|(a, _)| a)));
            field(tag + 1, section.map_or(&[][..], |(_, d)| d));
        }
        field(9, &opt(self.debug_frame.map(|d| d.len() as u64)));
        field(10, self.debug_frame.unwrap_or_default());
        h.finalize().into()
    }

    /// Builds the table.
    pub fn build(&self) -> anyhow::Result<(UnwindTable, CfiSource)> {
        let mut builder = RowBuilder::new(self.row_limit, BUILD_CPU_BUDGET);
        let source = if let Some((eh_addr, eh_data)) = self.eh_frame {
            let mut bases = BaseAddresses::default().set_eh_frame(eh_addr);
            if let Some(text) = self.text {
                bases = bases.set_text(text);
            }
            if let Some(got) = self.got {
                bases = bases.set_got(got);
            }
            let eh_frame = EhFrame::new(eh_data, LittleEndian);
            match self.eh_frame_hdr {
                Some((hdr_addr, hdr_data)) => {
                    bases = bases.set_eh_frame_hdr(hdr_addr);
                    collect_from_hdr(&eh_frame, eh_data.len(), hdr_data, &bases, &mut builder)?;
                    CfiSource::EhFrameHdr
                }
                None => {
                    collect_all(&eh_frame, &bases, &mut builder)?;
                    CfiSource::EhFrame
                }
            }
        } else if let Some(df_data) = self.debug_frame {
            let mut debug_frame = DebugFrame::new(df_data, LittleEndian);
            debug_frame.set_address_size(8);
            collect_all(&debug_frame, &BaseAddresses::default(), &mut builder)?;
            CfiSource::DebugFrame
        } else {
            CfiSource::None
        };
        Ok((builder.finish()?, source))
    }
}

/// Bytes of call frame information per table row, at least: measured 5.4-6.8 on libc,
/// CPython, libc10, libtorch_python, libtorch_cpu and libtorch_cuda (the smallest ratio
/// gives the most rows, so the estimate errs on the side of room).
const CFI_BYTES_PER_ROW: u64 = 5;

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
fn section_sizes<'data, Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
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
        if offset >= segment.file_start && offset < segment.file_start + segment.file_size.max(1) {
            return Ok(bias(segment.file_start, segment.vaddr));
        }
    }
    Err(anyhow!("no PT_LOAD segment holds file offset {offset:#x}"))
}

/// A `PT_LOAD` segment, as [`load_bias`] needs it.
struct LoadSegment {
    file_start: u64,
    file_size: u64,
    vaddr: u64,
    executable: bool,
}

/// The `PT_LOAD` segments of the ELF file `data`, from its program headers.
fn load_segments<'data, Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
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
const PAGE_SIZE: u64 = 4096;

/// How the reason an object's table was refused for exceeding a build bound begins, so that
/// the loader warns about it (a hostile or broken file is worth a warning, not a debug line).
pub const BUILD_LIMIT: &str = "build limit";

/// Rows one table may ever have, whatever the object: the kernel walk bisects a table in
/// [`profiler_common::UNWIND_TABLE_SEARCH_STEPS`] steps (4M rows, 32 MiB), so a larger one
/// could never be used and building it would only cost the daemon memory.
pub const MAX_TABLE_ROWS: usize = 1 << profiler_common::UNWIND_TABLE_SEARCH_STEPS;

/// Rows allowed beyond one per byte of executable code: an object's closing rows (one past
/// each FDE) and the vDSO's or a tiny object's few rows.
const ROW_SLACK: u64 = 4096;

/// CPU time one object's table may take to build: the largest real object measured
/// (libtorch_cpu.so, 2.6M rows) takes 0.27 s in a debug build, so 5 s is far beyond any honest
/// file and still ends a hostile one long before it costs other users anything (a crafted
/// `.eh_frame_hdr` took 34 s before this bound).
pub const BUILD_CPU_BUDGET: Duration = Duration::from_secs(5);

/// Work between two checks of the CPU budget, in rows: reading the thread's clock is a
/// system call (libtorch_cpu.so's 2.6M rows and 300k FDEs cost about 700 reads).
const WORK_PER_BUDGET_CHECK: usize = 4096;

/// What reading one FDE counts for against [`WORK_PER_BUDGET_CHECK`], in rows: evaluating it
/// starts with its CIE's initial instructions, which a crafted CIE makes long and every FDE
/// may share, so FDEs that yield no row must still reach a check.
const WORK_PER_FDE: usize = 64;

/// The most rows the table of `elf` can honestly have: each row starts at a distinct
/// instruction, so no more than one per byte of executable code (plus [`ROW_SLACK`]), and
/// never more than [`MAX_TABLE_ROWS`].
fn row_limit<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>) -> usize {
    let sections: u64 = elf
        .sections()
        .filter(|s| {
            matches!(s.flags(), object::SectionFlags::Elf { sh_flags }
                if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
        })
        .map(|s| s.size())
        .fold(0, u64::saturating_add);
    // An image without section headers (some vDSOs read from memory): its executable segments.
    let code = if sections > 0 {
        sections
    } else {
        elf.segments()
            .filter(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .map(|s| s.size())
            .fold(0, u64::saturating_add)
    };
    code.saturating_add(ROW_SLACK).min(MAX_TABLE_ROWS as u64) as usize
}

/// Walks the FDEs in the order `.eh_frame_hdr`'s binary search table lists them (sorted by
/// address), falling back to a plain scan when the header has no table, or names an FDE
/// twice. Each FDE is evaluated once: a crafted header whose many entries pointed at one
/// large FDE made the builder evaluate it once per entry (34 s of CPU and 3 GB from a 1 MB
/// file); an entry whose FDE starts inside the ranges read so far is skipped.
fn collect_from_hdr(
    eh_frame: &EhFrame<Slice<'_>>,
    eh_frame_len: usize,
    hdr_data: &[u8],
    bases: &BaseAddresses,
    builder: &mut RowBuilder,
) -> anyhow::Result<()> {
    let hdr = EhFrameHdr::new(hdr_data, LittleEndian)
        .parse(bases, 8)
        .context("parsing .eh_frame_hdr")?;
    let Some(table) = hdr.table() else {
        return collect_all(eh_frame, bases, builder);
    };
    let mut ctx = UnwindContext::new();
    let mut entries = table.iter(bases);
    // One bit per byte of `.eh_frame`: which offsets were read. A hash set of them was a tenth
    // of libtorch_cpu.so's build (its 4 MiB of bits are freed when the table is done).
    let mut read = vec![0u64; eh_frame_len.div_ceil(64)];
    let mut covered_to = 0u64;
    while let Some((_, pointer)) = entries.next().context("reading .eh_frame_hdr's table")? {
        let offset =
            fde_offset(&hdr, pointer).context("an .eh_frame_hdr entry points outside .eh_frame")?;
        let Some(bits) = read.get_mut(offset.0 / 64) else {
            anyhow::bail!("an .eh_frame_hdr entry points past the end of .eh_frame");
        };
        let bit = 1u64 << (offset.0 % 64);
        let seen = *bits & bit != 0;
        *bits |= bit;
        if seen {
            // An index that names one FDE twice is no index of this `.eh_frame`: the section
            // itself is read instead, each FDE once, in its order.
            log::debug!(".eh_frame_hdr names an FDE twice: reading .eh_frame itself");
            builder.restart();
            return collect_all(eh_frame, bases, builder);
        }
        let fde = eh_frame
            .fde_from_offset(bases, offset, EhFrame::cie_from_offset)
            .context("reading an FDE")?;
        // The table is sorted by address: an FDE starting inside the ranges already read
        // describes code that has its rows (linkers never emit such overlaps).
        if fde.initial_address() < covered_to {
            builder.skipped_fdes += 1;
            builder.work(WORK_PER_FDE)?;
            continue;
        }
        covered_to = covered_to.max(fde.end_address());
        builder.add_fde(eh_frame, bases, &mut ctx, &fde)?;
    }
    Ok(())
}

/// Where an `.eh_frame_hdr` entry's FDE starts in `.eh_frame`; `None` for an entry pointing
/// before the section. (gimli's `pointer_to_offset` subtracts unchecked: such an entry
/// panicked with overflow checks, as in the debug build, and wrapped without; found by the
/// `unwind_cfi` fuzz target.)
fn fde_offset(
    hdr: &gimli::ParsedEhFrameHdr<Slice<'_>>,
    pointer: gimli::Pointer,
) -> Option<gimli::EhFrameOffset<usize>> {
    let pointer = pointer.direct().ok()?;
    let eh_frame = hdr.eh_frame_ptr().direct().ok()?;
    let offset = usize::try_from(pointer.checked_sub(eh_frame)?).ok()?;
    Some(gimli::EhFrameOffset(offset))
}

/// Walks every FDE of a CFI section in section order.
fn collect_all<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    builder: &mut RowBuilder,
) -> anyhow::Result<()>
where
    S::Offset: gimli::UnwindOffset<usize>,
{
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next().context("reading a CFI entry")? {
        if let CieOrFde::Fde(partial) = entry {
            let fde = partial
                .parse(S::cie_from_offset)
                .context("reading an FDE")?;
            builder.add_fde(section, bases, &mut ctx, &fde)?;
        }
    }
    Ok(())
}

/// Collects rows from FDEs in any order; [`RowBuilder::finish`] sorts and compacts them.
///
/// Bounded: it holds at most `max_rows` rows (rows equal to the one before them are merged as
/// they come, so the bound is on what the table could hold, not on what the CFI repeats), and
/// fails once the build has used `budget` of CPU time. Either makes the object's table
/// unavailable with the reason, rather than costing the daemon memory and time.
struct RowBuilder {
    rows: Vec<UnwindRow>,
    max_rows: usize,
    /// Whether `rows` is still sorted by pc (FDEs read in address order keep it so, and then
    /// equal neighbours are merged as they come).
    sorted: bool,
    /// The build's CPU budget and the thread's CPU time when it started.
    budget: Duration,
    started: Duration,
    /// Work done since the CPU budget was last checked (see [`WORK_PER_BUDGET_CHECK`]).
    since_check: usize,
    /// FDEs skipped because another entry had already read them or their range.
    skipped_fdes: u64,
}

impl RowBuilder {
    fn new(max_rows: usize, budget: Duration) -> RowBuilder {
        RowBuilder {
            rows: Vec::new(),
            max_rows,
            sorted: true,
            budget,
            started: thread_cpu_time(),
            since_check: 0,
            skipped_fdes: 0,
        }
    }

    /// Forgets the rows collected so far (the CPU budget keeps counting).
    fn restart(&mut self) {
        self.rows.clear();
        self.sorted = true;
    }

    fn add_fde<'a, S: UnwindSection<Slice<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        ctx: &mut UnwindContext<usize>,
        fde: &gimli::FrameDescriptionEntry<Slice<'a>>,
    ) -> anyhow::Result<()> {
        let end = fde.end_address();
        // Addresses beyond 4 GiB do not fit the 32-bit row pc; such objects do not exist in
        // practice (the largest shared objects are under 1 GiB).
        if end > u64::from(u32::MAX) {
            return Ok(());
        }
        self.work(WORK_PER_FDE)?;
        let mut table = match fde.rows(section, bases, ctx) {
            Ok(t) => t,
            // One unreadable FDE leaves its range to frame pointers; the rest still count.
            Err(_) => return Ok(()),
        };
        let signal = fde.is_signal_trampoline();
        while let Ok(Some(row)) = table.next_row() {
            if row.start_address() >= row.end_address() {
                continue;
            }
            self.push(convert(section, row, signal))?;
        }
        // Past the FDE, nothing is known until the next FDE starts.
        self.push(no_info(end as u32))
    }

    /// Counts `units` of work, failing once the build used more than its CPU budget.
    fn work(&mut self, units: usize) -> anyhow::Result<()> {
        self.since_check += units;
        if self.since_check < WORK_PER_BUDGET_CHECK {
            return Ok(());
        }
        self.since_check = 0;
        let used = thread_cpu_time().saturating_sub(self.started);
        if used > self.budget {
            return Err(anyhow!(
                "{BUILD_LIMIT}: its call frame information took more than {} s of CPU to read \
                 ({} rows so far; a broken or hostile file)",
                self.budget.as_secs(),
                self.rows.len()
            ));
        }
        Ok(())
    }

    /// Adds one row, merging it into the last when the rows are in order and it changes
    /// nothing; fails past the row limit or the CPU budget. (Rows merged before an
    /// out-of-order FDE arrives stay merged: only overlapping FDEs, which no linker emits,
    /// read differently than by sorting everything first.)
    fn push(&mut self, row: UnwindRow) -> anyhow::Result<()> {
        self.work(1)?;
        if let Some(last) = self.rows.last_mut() {
            if row.pc < last.pc {
                self.sorted = false;
            } else if self.sorted {
                // A later FDE's row at the same pc wins, as in `finish`.
                if last.pc == row.pc {
                    *last = row;
                    return Ok(());
                }
                if same_rule(last, &row) {
                    return Ok(());
                }
            }
        }
        if self.rows.len() >= self.max_rows {
            return Err(anyhow!(
                "{BUILD_LIMIT}: its call frame information has more than {} rows, more than its \
                 code could hold (a broken or hostile file)",
                self.max_rows
            ));
        }
        self.rows.push(row);
        Ok(())
    }

    fn finish(self) -> anyhow::Result<UnwindTable> {
        if self.skipped_fdes > 0 {
            log::debug!(
                "{} CFI entries skipped: they repeat FDEs or ranges already read",
                self.skipped_fdes
            );
        }
        let mut unsorted = self.rows;
        // Stable sort: an FDE's closing NoInfo row and the next FDE's first row share a pc,
        // and the latter, pushed later, must win.
        unsorted.sort_by_key(|r| r.pc);
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(unsorted.len());
        for row in unsorted {
            if let Some(last) = rows.last_mut() {
                if last.pc == row.pc {
                    *last = row;
                    continue;
                }
                if same_rule(last, &row) {
                    continue;
                }
            }
            rows.push(row);
        }
        // Collapsing equal pcs can leave two equal neighbours behind.
        rows.dedup_by(|b, a| same_rule(a, b));
        Ok(UnwindTable { rows })
    }
}

fn same_rule(a: &UnwindRow, b: &UnwindRow) -> bool {
    UnwindRow { pc: 0, ..*a } == UnwindRow { pc: 0, ..*b }
}

fn no_info(pc: u32) -> UnwindRow {
    UnwindRow::new(pc, CfaRule::NoInfo, 0, None, 0).expect("a valid row")
}

/// Reduces one gimli row to what the kernel walk can evaluate.
fn convert<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
    signal_trampoline: bool,
) -> UnwindRow {
    let pc = row.start_address() as u32;
    if signal_trampoline {
        // glibc's (and musl's) `__restore_rt`: CFA = *(rsp + 160), registers at fixed offsets
        // from rsp in the saved ucontext. The walk reads that context itself; any other
        // signal-frame CFI is left to frame pointers.
        let is_ucontext = matches!(row.cfa(), GimliCfa::Expression(expr)
            if expr.get(section).is_ok_and(|e| e.0.slice() == SIGCONTEXT_CFA));
        return if is_ucontext {
            UnwindRow::new(pc, CfaRule::SignalFrame, 0, None, 0).expect("a valid row")
        } else {
            no_info(pc)
        };
    }
    match row.register(X86_64::RA) {
        None | Some(RegisterRule::Undefined) => {
            return UnwindRow::new(pc, CfaRule::EndOfStack, 0, None, 0).expect("a valid row")
        }
        Some(RegisterRule::Offset(RETURN_ADDRESS_OFFSET)) => {}
        Some(_) => return no_info(pc),
    };
    // gcc's stack realignment: CFA = *(rbp - N), the caller's rbp saved at rbp.
    if let GimliCfa::Expression(expr) = row.cfa() {
        let realigned = expr
            .get(section)
            .ok()
            .and_then(|e| realigned_cfa(e.0.slice()));
        let rbp_at_rbp = matches!(row.register(X86_64::RBP), Some(RegisterRule::Expression(e))
            if e.get(section).is_ok_and(|e| e.0.slice() == RBP_AT_RBP));
        if let (Some(offset), true) = (realigned, rbp_at_rbp) {
            return UnwindRow::new(pc, CfaRule::RbpDeref, offset, None, 0)
                .unwrap_or_else(|| no_info(pc));
        }
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => None,
        Some(RegisterRule::Offset(off)) => match i16::try_from(off) {
            Ok(off) => Some(off),
            Err(_) => return no_info(pc),
        },
        Some(_) => return no_info(pc),
    };
    let (rule, cfa_offset, plt_threshold) = match row.cfa() {
        GimliCfa::RegisterAndOffset { register, offset } => {
            // CFA offsets are positive (the CFA lies above the frame); u16 reaches 64 KiB frames.
            let Ok(offset) = u16::try_from(*offset) else {
                return no_info(pc);
            };
            match *register {
                X86_64::RSP => (CfaRule::Rsp, offset, 0),
                X86_64::RBP => (CfaRule::Rbp, offset, 0),
                _ => return no_info(pc),
            }
        }
        GimliCfa::Expression(expr) => {
            match expr.get(section).ok().and_then(|e| plt_rule(e.0.slice())) {
                Some((offset, threshold)) if rbp.is_none() => (CfaRule::Plt, offset, threshold),
                _ => return no_info(pc),
            }
        }
    };
    UnwindRow::new(pc, rule, cfa_offset, rbp, plt_threshold).unwrap_or_else(|| no_info(pc))
}

/// `DW_OP_breg6 (rbp) 0`: where a realigned frame saved its caller's rbp.
const RBP_AT_RBP: &[u8] = &[0x76, 0x00];

/// Recognizes the CFA expression of gcc's stack realignment, `DW_OP_breg6 (rbp) -N;
/// DW_OP_deref` (CFA = *(rbp - N)), and returns N.
fn realigned_cfa(expr: &[u8]) -> Option<u16> {
    const BREG6: u8 = 0x76;
    const DEREF: u8 = 0x06;
    match expr {
        // A one-byte SLEB128 operand from -64 to -1 (0x40..=0x7f).
        [BREG6, n, DEREF] if (0x40..0x80).contains(n) => Some(0x80 - u16::from(*n)),
        _ => None,
    }
}

/// `DW_OP_breg7 (rsp) 160; DW_OP_deref`: the CFA of a signal trampoline is the interrupted
/// rsp saved in the ucontext at rsp + 160.
const SIGCONTEXT_CFA: &[u8] = &[0x77, 0xa0, 0x01, 0x06];

/// Recognizes the CFA expression GNU ld and lld emit for `.plt` entries:
/// `DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_litT; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`, i.e. CFA = rsp + N + ((rip & 15) >= T) * 8.
/// Returns (N, T).
fn plt_rule(expr: &[u8]) -> Option<(u16, u8)> {
    const BREG7: u8 = 0x77;
    const BREG16: u8 = 0x80;
    const LIT0: u8 = 0x30;
    const AND: u8 = 0x1a;
    const GE: u8 = 0x2a;
    const SHL: u8 = 0x24;
    const PLUS: u8 = 0x22;
    // The SLEB128 operands are small here: one byte each, positive (< 64).
    match expr {
        [BREG7, n, BREG16, 0, lit15, AND, lit_t, GE, lit3, SHL, PLUS]
            if *n < 0x40
                && *lit15 == LIT0 + 15
                && (LIT0..=LIT0 + 15).contains(lit_t)
                && *lit3 == LIT0 + 3 =>
        {
            Some((u16::from(*n), lit_t - LIT0))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    /// One row of `readelf --debug-dump=frames-interp`: (loc, cfa, rbp, ra) as readelf prints
    /// them ("rsp+8", "c-16", "u" for undefined/unchanged columns).
    fn readelf_rows(path: &Path) -> Vec<(u64, String, String, String)> {
        let out = std::process::Command::new("readelf")
            .args(["--wide", "--debug-dump=frames-interp"])
            .arg(path)
            .output()
            .expect("running readelf");
        // readelf exits 1 on objects whose separate debug file is missing; the dump is complete.
        assert!(
            !out.stdout.is_empty(),
            "readelf printed nothing for {}",
            path.display()
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let mut rows = Vec::new();
        let mut columns: Vec<String> = Vec::new();
        let mut in_fde = false;
        let mut fde_end = 0;
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if line.contains(" FDE ") {
                in_fde = true;
                // readelf also prints rows past the FDE's end, which apply nowhere.
                fde_end = line
                    .rsplit("..")
                    .next()
                    .and_then(|end| u64::from_str_radix(end.trim(), 16).ok())
                    .unwrap_or(0);
                continue;
            }
            if line.contains(" CIE") || line.contains("ZERO terminator") {
                in_fde = false;
                continue;
            }
            if words.first() == Some(&"LOC") {
                columns = words.iter().map(|w| w.to_string()).collect();
                continue;
            }
            if !in_fde || words.len() != columns.len() {
                continue;
            }
            let Ok(loc) = u64::from_str_radix(words[0], 16) else {
                continue;
            };
            if loc >= fde_end {
                continue;
            }
            let col = |name: &str| {
                columns
                    .iter()
                    .position(|c| c == name)
                    .map(|i| words[i].to_string())
                    .unwrap_or_else(|| "u".into())
            };
            rows.push((loc, col("CFA"), col("rbp"), col("ra")));
        }
        rows
    }

    fn describe(row: &UnwindRow) -> (String, String, String) {
        let cfa = match row.cfa_rule() {
            r if r == CfaRule::Rsp as u8 => format!("rsp+{}", row.cfa_offset),
            r if r == CfaRule::Rbp as u8 => format!("rbp+{}", row.cfa_offset),
            r if r == CfaRule::Plt as u8
                || r == CfaRule::SignalFrame as u8
                || r == CfaRule::RbpDeref as u8 =>
            {
                "exp".into()
            }
            r if r == CfaRule::EndOfStack as u8 => "end".into(),
            _ => "none".into(),
        };
        let rbp = match row.rbp_offset() {
            Some(off) => format!("c{off}"),
            None => "u".into(),
        };
        (cfa, rbp, format!("c{RETURN_ADDRESS_OFFSET}"))
    }

    fn rsp_row(pc: u32, offset: u16) -> UnwindRow {
        UnwindRow::new(pc, CfaRule::Rsp, offset, None, 0).unwrap()
    }

    #[test]
    fn a_build_past_its_row_bound_or_cpu_budget_is_refused_with_the_reason() {
        // Rows that change nothing are merged as they come and count for nothing.
        let mut builder = RowBuilder::new(10, BUILD_CPU_BUDGET);
        for pc in 0..1000 {
            builder.push(rsp_row(pc, 8)).unwrap();
        }
        assert_eq!(builder.rows.len(), 1);
        // Distinct rows past the bound: refused.
        let err = (0..11)
            .try_for_each(|pc| builder.push(rsp_row(1000 + pc, 16 + 8 * (pc as u16 % 2))))
            .unwrap_err();
        assert!(err.to_string().starts_with(BUILD_LIMIT), "{err}");
        assert!(err.to_string().contains("more than 10 rows"), "{err}");
        // Any CPU time is past a zero budget once the work reaches a check.
        let mut builder = RowBuilder::new(MAX_TABLE_ROWS, Duration::ZERO);
        let err = (0..WORK_PER_BUDGET_CHECK as u32 * 2)
            .try_for_each(|pc| builder.push(rsp_row(pc, 8 + 8 * (pc as u16 % 2))))
            .unwrap_err();
        assert!(err.to_string().starts_with(BUILD_LIMIT), "{err}");
        assert!(err.to_string().contains("s of CPU"), "{err}");
    }

    #[test]
    fn the_row_bound_follows_the_code_size() {
        let libc = std::fs::read(LIBC).unwrap();
        let elf = object::File::parse(&*libc).unwrap();
        let limit = row_limit(&elf);
        // libc has about 1.4 MB of code and 28k rows.
        assert!((1_000_000..3_000_000).contains(&limit), "{limit}");
        let (table, _) = UnwindTable::from_elf(&*libc).unwrap();
        assert!(table.rows.len() * 10 < limit);
    }

    #[test]
    fn gcc_stack_realignment_is_read_and_other_expressions_are_not() {
        // DW_OP_breg6 (rbp) -8; DW_OP_deref, and -16.
        assert_eq!(realigned_cfa(&[0x76, 0x78, 0x06]), Some(8));
        assert_eq!(realigned_cfa(&[0x76, 0x70, 0x06]), Some(16));
        // A positive offset, another register, no deref: not this rule.
        assert_eq!(realigned_cfa(&[0x76, 0x08, 0x06]), None);
        assert_eq!(realigned_cfa(&[0x77, 0x78, 0x06]), None);
        assert_eq!(realigned_cfa(&[0x76, 0x78]), None);
    }

    /// Every readelf row whose rules the walk supports must read back the same from our table.
    fn check_against_readelf(path: &Path) -> usize {
        let (table, source) = UnwindTable::from_path(path).expect("building the table");
        assert_ne!(source, CfiSource::None);
        let expected = readelf_rows(path);
        assert!(!expected.is_empty(), "readelf printed no rows");
        let mut checked = 0;
        for (loc, cfa, rbp, ra) in &expected {
            if ra == "u" {
                let row = table.lookup(*loc).expect("a row");
                assert_eq!(row.cfa_rule(), CfaRule::EndOfStack as u8, "at {loc:#x}");
                continue;
            }
            let row = table
                .lookup(*loc)
                .unwrap_or_else(|| panic!("no row at {loc:#x}"));
            let (our_cfa, our_rbp, our_ra) = describe(row);
            if cfa == "exp" {
                assert!(
                    our_cfa == "exp" || our_cfa == "none",
                    "at {loc:#x}: {our_cfa}"
                );
                continue;
            }
            if our_cfa == "none" {
                // Rules the walk does not evaluate (registers other than rsp/rbp).
                let supported = |s: &str| s == "u" || s.starts_with("c-");
                assert!(
                    !(cfa.starts_with("rsp") || cfa.starts_with("rbp"))
                        || !supported(rbp)
                        || cfa[4..].parse::<u64>().is_ok_and(|off| off > 0xffff)
                        || !supported(ra),
                    "at {loc:#x}: readelf {cfa} {rbp} {ra}, ours none"
                );
                continue;
            }
            assert_eq!(
                (&our_cfa, &our_rbp, &our_ra),
                (cfa, rbp, ra),
                "at {loc:#x} in {}",
                path.display()
            );
            checked += 1;
        }
        checked
    }

    #[test]
    fn ld_so_rows_match_readelf() {
        let checked = check_against_readelf(Path::new("/lib64/ld-linux-x86-64.so.2"));
        assert!(checked > 500, "only {checked} rows checked");
        // __tls_get_addr's fast path: no frame, the return address at rsp.
        let (table, _) = UnwindTable::from_path(Path::new("/lib64/ld-linux-x86-64.so.2")).unwrap();
        let row = table.lookup(0x144c0).expect("a row");
        assert_eq!(
            (row.cfa_rule(), row.cfa_offset),
            (CfaRule::Rsp as u8, 8),
            "{row:?}"
        );
    }

    #[test]
    fn libc_rows_match_readelf() {
        let checked = check_against_readelf(Path::new(LIBC));
        assert!(checked > 5000, "only {checked} rows checked");
    }

    #[test]
    fn libc_plt_expression_is_recognized() {
        let (table, _) = UnwindTable::from_path(Path::new(LIBC)).unwrap();
        assert!(
            table
                .rows
                .iter()
                .any(|r| r.cfa_rule() == CfaRule::Plt as u8),
            "libc's .plt has the PLT CFA expression"
        );
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert_eq!(std::mem::size_of::<UnwindRow>(), 8);
    }

    #[test]
    fn the_row_estimate_counts_only_cfi_bytes_the_file_has() {
        let mut image = std::fs::read(LIBC).unwrap();
        let honest = estimate_rows(&image[..]);
        assert!(honest > 10_000, "libc's estimate {honest}");
        // Claim 4 GiB of .eh_frame: sh_size of its section header.
        let header = {
            let elf =
                object::read::elf::ElfFile64::<object::Endianness>::parse(&image[..]).unwrap();
            let index = elf.section_by_name(".eh_frame").unwrap().index().0;
            let shoff = elf.elf_header().e_shoff.get(object::Endianness::Little) as usize;
            shoff + index * 64
        };
        image[header + 32..header + 40].copy_from_slice(&(4u64 << 30).to_le_bytes());
        assert_eq!(estimate_rows(&image[..]), 0);
    }

    #[test]
    fn an_eh_frame_hdr_entry_before_eh_frame_is_an_error_not_a_panic() {
        let mut image = std::fs::read(LIBC).unwrap();
        let (hdr_offset, encoding) = {
            let elf = object::File::parse(&image[..]).unwrap();
            let hdr = elf.section_by_name(".eh_frame_hdr").unwrap();
            let eh_frame = elf.section_by_name(".eh_frame").unwrap();
            assert!(
                hdr.address() < eh_frame.address(),
                "libc's .eh_frame_hdr comes first"
            );
            let offset = hdr.file_range().unwrap().0 as usize;
            (offset, image[offset + 3])
        };
        // DW_EH_PE_datarel | DW_EH_PE_sdata4: (initial location, FDE) pairs relative to the
        // header, after its 12 bytes. The first entry's FDE at 0 is the header itself.
        assert_eq!(encoding, 0x3b);
        image[hdr_offset + 16..hdr_offset + 20].copy_from_slice(&0i32.to_le_bytes());
        let err = UnwindTable::from_elf(&image[..]).unwrap_err();
        assert!(format!("{err:#}").contains("outside .eh_frame"), "{err:#}");
    }

    #[test]
    fn omit_frame_pointer_workload_matches_readelf() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("w.c");
        std::fs::write(
            &src,
            "#include <stdlib.h>\n\
             __attribute__((noinline)) long leaf(long n) { volatile long s = 0; for (long i = 0; i < n; i++) s += i; return s; }\n\
             __attribute__((noinline)) long mid(long n) { char buf[300]; buf[n % 300] = 1; return leaf(n) + buf[n % 7]; }\n\
             int main(int argc, char **argv) { return (int)mid(argc * 1000); }\n",
        )
        .unwrap();
        let exe = dir.path().join("w");
        let status = std::process::Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("running cc");
        assert!(status.success());
        let checked = check_against_readelf(&exe);
        assert!(checked >= 4, "only {checked} rows checked");
        // `mid` has a 300-byte frame: some row must say CFA = rsp + more than 300.
        let (table, _) = UnwindTable::from_path(&exe).unwrap();
        assert!(table
            .rows
            .iter()
            .any(|r| r.cfa_rule() == CfaRule::Rsp as u8 && r.cfa_offset > 300));
    }

    #[test]
    fn vdso_image_from_memory_matches_readelf() {
        // The vDSO has no file: its image is read from memory, as the loader reads a target's.
        let (_, image) = crate::process::vdso::own_image();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vdso.so");
        std::fs::write(&path, &image).unwrap();
        let (table, source) = UnwindTable::from_elf(image.as_slice()).unwrap();
        assert_eq!(source, CfiSource::EhFrameHdr);
        assert!(!table.rows.is_empty());
        let checked = check_against_readelf(&path);
        assert!(checked >= 10, "only {checked} rows checked");
    }

    #[test]
    fn load_bias_of_a_text_segment_whose_page_starts_in_the_previous_one() {
        // This test binary is linked by rust-lld, which puts .text right after the read-only
        // data in the file but one page further in memory: the page the kernel maps .text
        // from lies inside the read-only segment's file range.
        use object::{Object, ObjectSymbol};
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = object::File::parse(&*exe).unwrap();
        let marker =
            load_bias_of_a_text_segment_whose_page_starts_in_the_previous_one as *const () as usize;
        let symbol = elf
            .symbols()
            .find(|s| {
                s.name().is_ok_and(|n| {
                    n.contains(
                        "load_bias_of_a_text_segment_whose_page_starts_in_the_previous_one17h",
                    )
                })
            })
            .expect("the test's own symbol");
        let maps = procfs::process::Process::myself().unwrap().maps().unwrap();
        let text = maps
            .iter()
            .find(|m| {
                let (start, end) = m.address;
                (start..end).contains(&(marker as u64))
            })
            .expect("the mapping of this test's code");
        let bias = load_bias(exe.as_slice(), text.address.0, text.offset).unwrap();
        assert_eq!(bias.wrapping_add(symbol.address()), marker as u64);
    }
}
