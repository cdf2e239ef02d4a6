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
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, EhFrameHdr, LittleEndian, UnwindContext,
    UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment};
use profiler_common::UnwindRow;

mod rows;
mod sizes;

use rows::RowBuilder;
pub use sizes::{estimate_process_rows, estimate_rows, load_bias};

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

#[cfg(test)]
mod tests {
    use super::rows::realigned_cfa;
    use super::*;
    use profiler_common::{CfaRule, RETURN_ADDRESS_OFFSET};

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

    /// A target's file is hostile input: a `PT_LOAD` whose offset and size add up past 2^64
    /// (found by the `unwind_elf` fuzz target, whose corpus keeps the file) is answered
    /// without overflowing.
    #[test]
    fn a_load_segment_past_the_end_of_the_address_space_is_no_panic() {
        let data = include_bytes!("../../../fuzz/corpus/unwind_elf/hostile-load-segment-past-2-64");
        // Either answer is right for such a file; reaching one is the test.
        let _ = load_bias(&data[..], 0x7f12_3456_7000, 0x1000);
    }
}
