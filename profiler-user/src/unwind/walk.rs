//! A CFI walk in userspace, by the kernel program's rules, over a stopped thread's registers
//! and a copy of its stack (see [`crate::process::snapshot`]): what `bpfprof dump` unwinds
//! with. The same [`UnwindTable`] rows, the same rules (rsp- and rbp-based CFA, PLT stubs,
//! signal frames, realigned frames, the outermost frame's undefined return address), and the
//! frame pointer where no CFI covers a pc.

use std::{collections::HashMap, path::Path, sync::Arc};

use anyhow::Context;
use profiler_common::{
    CfaRule, UnwindRow, RETURN_ADDRESS_OFFSET, SIGNAL_FRAME_RBP, SIGNAL_FRAME_RIP, SIGNAL_FRAME_RSP,
};

use super::{
    table::{load_bias, UnwindTable},
    FileKey,
};
use crate::process::{snapshot::Registers, target_file};

/// Most frames one walk records (the kernel program's bound).
pub const MAX_WALK_FRAMES: usize = profiler_common::MAX_STACK_DEPTH;

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WalkEnd {
    /// At the outermost frame (CFI marks it, or its return address or frame pointer is 0).
    Complete,
    /// At a frame it could not unwind: no mapping, no CFI and no frame pointer, or a read
    /// that failed.
    Early,
    /// At [`MAX_WALK_FRAMES`].
    Cut,
}

/// Why a walk ended, in detail: what `bpfprof dump` says under each stack, so that a stack
/// cut short says where and why (and a whole one that it is whole).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum StackEnd {
    /// At the thread's entry: the outermost frame (its CFI marks the end of the stack, as
    /// `_start`'s and a thread start's do, or its return address or frame pointer is 0).
    Entry,
    /// At a pc in no object the process maps executable from a file (anonymous memory, such
    /// as JIT code, or a return address that is wrong).
    NoObject {
        /// The pc, `0x...`.
        address: String,
    },
    /// At a pc of `object` that its unwind table has no row for (or the object has no table),
    /// where the frame pointer led to no code either.
    NoUnwindRow {
        /// The pc, `0x...`.
        address: String,
        /// The object's path (or `[vdso]`).
        object: String,
    },
    /// A read of the thread's stack (or of a signal frame) that failed.
    ReadFailed {
        /// The address read, `0x...`.
        address: String,
    },
    /// The caller's frame would not lie above this one: a frame-pointer loop, or a stack
    /// that is not what the unwind row says.
    NotAbove {
        /// The pc of the frame whose caller was not above it, `0x...`.
        address: String,
    },
    /// At the most frames a walk records ([`MAX_WALK_FRAMES`]).
    DepthLimit {
        /// The frames walked.
        frames: usize,
    },
}

impl StackEnd {
    /// The coarse outcome, as `dump --json`'s `unwind` gives it.
    pub fn outcome(&self) -> WalkEnd {
        match self {
            StackEnd::Entry => WalkEnd::Complete,
            StackEnd::DepthLimit { .. } => WalkEnd::Cut,
            _ => WalkEnd::Early,
        }
    }

    /// In words, for the text output.
    pub fn describe(&self) -> String {
        match self {
            StackEnd::Entry => "reached the thread's entry".into(),
            StackEnd::NoObject { address } => {
                format!("{address} is in no mapped file (anonymous memory: JIT code, or a bad return address)")
            }
            StackEnd::NoUnwindRow { address, object } => {
                format!("no unwind row for {address} in {object}, and no frame pointer to follow")
            }
            StackEnd::ReadFailed { address } => {
                format!("reading the stack at {address} failed")
            }
            StackEnd::NotAbove { address } => format!(
                "the caller of {address} is not above it on the stack (a frame-pointer loop, or a bad unwind row)"
            ),
            StackEnd::DepthLimit { frames } => format!("the depth limit ({frames} frames)"),
        }
    }
}

fn hex(address: u64) -> String {
    format!("{address:#x}")
}

/// One executable mapping and the table of its object.
struct Mapped {
    start: u64,
    end: u64,
    bias: u64,
    /// Index in [`ProcessTables::tables`]; `None` for an object whose table could not be built.
    table: Option<usize>,
    /// Its object's path (or `[vdso]`), for a walk that ends in it.
    object: Arc<str>,
}

/// The tables of the objects already built, by file: several processes' walks (a
/// system-wide run's start) build each shared library's table once.
pub type TableCache = HashMap<FileKey, Option<Arc<UnwindTable>>>;

/// The unwind tables of every object a process maps executable, by address.
#[derive(Default)]
pub struct ProcessTables {
    mappings: Vec<Mapped>,
    tables: Vec<Arc<UnwindTable>>,
    /// Objects whose table could not be built, with why (for the caller's log).
    pub failed: Vec<String>,
}

impl ProcessTables {
    /// Builds the tables of every object process `pid` maps executable (each file once),
    /// the vDSO included.
    pub fn build(pid: u32) -> anyhow::Result<ProcessTables> {
        Self::build_with(pid, &mut TableCache::new())
    }

    /// [`Self::build`], taking the tables of files already in `cache` from it and adding the
    /// others.
    pub fn build_with(pid: u32, cache: &mut TableCache) -> anyhow::Result<ProcessTables> {
        let maps = procfs::process::Process::new(pid as i32)
            .and_then(|p| p.maps())
            .with_context(|| format!("reading /proc/{pid}/maps"))?;
        let mut out = ProcessTables::default();
        let mut by_file: HashMap<FileKey, Option<usize>> = HashMap::new();
        for map in maps.0 {
            if !map.perms.contains(procfs::process::MMPermissions::EXECUTE) {
                continue;
            }
            let (start, end) = map.address;
            let (built, object): (_, Arc<str>) = match &map.pathname {
                procfs::process::MMapPath::Path(path) => {
                    let dev_ino = (libc::makedev(map.dev.0 as u32, map.dev.1 as u32), map.inode);
                    let built = out.file_table(
                        pid,
                        (start, end),
                        map.offset,
                        (path, dev_ino),
                        (&mut by_file, cache),
                    );
                    (built, path.display().to_string().into())
                }
                procfs::process::MMapPath::Vdso => {
                    (out.vdso_table(pid, start, end), "[vdso]".into())
                }
                _ => continue,
            };
            match built {
                Ok((bias, table)) => out.mappings.push(Mapped {
                    start,
                    end,
                    bias,
                    table,
                    object,
                }),
                Err(e) => out.failed.push(format!("{:?}: {e:#}", map.pathname)),
            }
        }
        out.mappings.sort_by_key(|m| m.start);
        Ok(out)
    }

    /// The bias and table of a file mapping, each file's table built once.
    fn file_table(
        &mut self,
        pid: u32,
        (start, end): (u64, u64),
        offset: u64,
        (path, dev_ino): (&Path, (u64, u64)),
        (by_file, cache): (&mut HashMap<FileKey, Option<usize>>, &mut TableCache),
    ) -> anyhow::Result<(u64, Option<usize>)> {
        // Through map_files, else (a user other than root is refused map_files: EPERM) the
        // path in the target's own root, if it is still the mapped device and inode.
        let (file, _) = target_file::open_mapped(pid, (start, end), path, dev_ino)
            .with_context(|| format!("opening {}", path.display()))?;
        let meta = file.metadata().context("stat")?;
        if !meta.is_file() {
            anyhow::bail!("not a regular file");
        }
        let reader = target_file::ElfReader::new(file.try_clone()?);
        let bias = load_bias(&reader, start, offset).map_err(|e| reader.explain(e))?;
        let key = FileKey::of_file(&meta);
        if let Some(&table) = by_file.get(&key) {
            return Ok((bias, table));
        }
        let built = match cache.get(&key) {
            Some(built) => built.clone(),
            None => {
                let built = match UnwindTable::from_elf(&reader).map_err(|e| reader.explain(e)) {
                    Ok((table, _)) => Some(Arc::new(table)),
                    Err(e) => {
                        self.failed.push(format!("{}: {e:#}", path.display()));
                        None
                    }
                };
                cache.insert(key.clone(), built.clone());
                built
            }
        };
        let table = built.map(|table| {
            self.tables.push(table);
            self.tables.len() - 1
        });
        by_file.insert(key, table);
        Ok((bias, table))
    }

    /// The bias and table of the vDSO, read from the process's memory.
    fn vdso_table(
        &mut self,
        pid: u32,
        start: u64,
        end: u64,
    ) -> anyhow::Result<(u64, Option<usize>)> {
        let image = crate::process::vdso::read_image(pid, start, end)?;
        let bias = load_bias(image.as_slice(), start, 0)?;
        let (table, _) = UnwindTable::from_elf(image.as_slice())?;
        self.tables.push(Arc::new(table));
        Ok((bias, Some(self.tables.len() - 1)))
    }

    /// The mapping that holds `pc`.
    fn mapping(&self, pc: u64) -> Option<&Mapped> {
        let i = self.mappings.partition_point(|m| m.start <= pc);
        let m = &self.mappings[i.checked_sub(1)?];
        (pc < m.end).then_some(m)
    }

    /// The row that covers `pc`, if its object has CFI for it.
    fn row(&self, pc: u64) -> Option<UnwindRow> {
        let m = self.mapping(pc)?;
        let table = &self.tables[m.table?];
        table
            .lookup(pc.wrapping_sub(m.bias))
            .copied()
            .filter(|r| r.cfa_rule() != CfaRule::NoInfo as u8)
    }

    /// Walks a thread's stack from `regs`, reading its memory with `read` (the copy made while
    /// it was stopped, then the live process): the instruction pointers, innermost first
    /// (every one but the first a return address), and why the walk ended.
    pub fn walk(&self, regs: Registers, read: impl Fn(u64) -> Option<u64>) -> (Vec<u64>, WalkEnd) {
        let (frames, end) = self.walk_explained(regs, read);
        (frames, end.outcome())
    }

    /// [`Self::walk`], saying in detail why the walk ended.
    pub fn walk_explained(
        &self,
        regs: Registers,
        read: impl Fn(u64) -> Option<u64>,
    ) -> (Vec<u64>, StackEnd) {
        let (mut ip, mut sp, mut bp) = (regs.ip, regs.sp, regs.bp);
        // The first failed read's address, for the end that names it.
        let failed = std::cell::Cell::new(0u64);
        let read = |addr: u64| {
            let value = read(addr);
            if value.is_none() {
                failed.set(addr);
            }
            value
        };
        let read_failed = || StackEnd::ReadFailed {
            address: hex(failed.get()),
        };
        let mut frames = Vec::new();
        loop {
            if frames.len() >= MAX_WALK_FRAMES {
                return (
                    frames,
                    StackEnd::DepthLimit {
                        frames: MAX_WALK_FRAMES,
                    },
                );
            }
            frames.push(ip);
            // A return address points after the call; the call belongs to the caller's row.
            let pc = if frames.len() == 1 { ip } else { ip - 1 };
            let Some(mapped) = self.mapping(pc) else {
                return (frames, StackEnd::NoObject { address: hex(pc) });
            };
            let (cfa, rbp_at) = match self.row(pc) {
                Some(row) if row.cfa_rule() == CfaRule::EndOfStack as u8 => {
                    return (frames, StackEnd::Entry)
                }
                Some(row) if row.cfa_rule() == CfaRule::SignalFrame as u8 => {
                    // The interrupted frame's registers, saved in the ucontext at rsp.
                    let saved = (
                        read(sp.wrapping_add(SIGNAL_FRAME_RIP)),
                        read(sp.wrapping_add(SIGNAL_FRAME_RSP)),
                        read(sp.wrapping_add(SIGNAL_FRAME_RBP)),
                    );
                    let (Some(i), Some(s), Some(b)) = saved else {
                        return (frames, read_failed());
                    };
                    // The interrupted pc is exact: look it up as an innermost frame by
                    // adding the byte the next round takes off.
                    (ip, sp, bp) = (i + 1, s, b);
                    continue;
                }
                Some(row) if row.cfa_rule() == CfaRule::RbpDeref as u8 => {
                    let Some(cfa) = read(bp.wrapping_sub(row.cfa_offset as u64)) else {
                        return (frames, read_failed());
                    };
                    (cfa, Some(bp))
                }
                Some(row) => {
                    let offset = row.cfa_offset as u64;
                    let cfa = match row.cfa_rule() {
                        r if r == CfaRule::Rsp as u8 => sp.wrapping_add(offset),
                        r if r == CfaRule::Rbp as u8 => bp.wrapping_add(offset),
                        // A PLT stub: 8 more once it has pushed its relocation index.
                        _ => {
                            let extra = if ip & 15 >= row.plt_threshold() as u64 {
                                8
                            } else {
                                0
                            };
                            sp.wrapping_add(offset + extra)
                        }
                    };
                    let rbp_at = row
                        .rbp_offset()
                        .map(|off| cfa.wrapping_add(off as i64 as u64));
                    (cfa, rbp_at)
                }
                None => {
                    // No CFI: the frame pointer, when it leads above the frame into code.
                    if bp == 0 {
                        return (frames, StackEnd::Entry);
                    }
                    if bp < sp {
                        return (frames, StackEnd::NotAbove { address: hex(pc) });
                    }
                    let (Some(ra), Some(next_bp)) = (read(bp.wrapping_add(8)), read(bp)) else {
                        return (frames, read_failed());
                    };
                    if ra != 0 && self.mapping(ra - 1).is_none() {
                        // The frame pointer leads nowhere: this code keeps none.
                        return (
                            frames,
                            StackEnd::NoUnwindRow {
                                address: hex(pc),
                                object: mapped.object.to_string(),
                            },
                        );
                    }
                    if ra == 0 {
                        return (frames, StackEnd::Entry);
                    }
                    (ip, sp, bp) = (ra, bp.wrapping_add(16), next_bp);
                    continue;
                }
            };
            // The stack grows down: a caller's frame lies above.
            if cfa <= sp {
                return (frames, StackEnd::NotAbove { address: hex(pc) });
            }
            let Some(ra) = read(cfa.wrapping_add(RETURN_ADDRESS_OFFSET as u64)) else {
                return (frames, read_failed());
            };
            if let Some(at) = rbp_at {
                match read(at) {
                    Some(saved) => bp = saved,
                    None => return (frames, read_failed()),
                }
            }
            if ra == 0 {
                return (frames, StackEnd::Entry);
            }
            (ip, sp) = (ra, cfa);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks this thread's own stack from inside this function (its frame and its callers'
    /// stay put while it runs), reading memory directly.
    #[inline(never)]
    fn walk_here(tables: &ProcessTables) -> (Vec<u64>, WalkEnd, u64) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers; no memory is touched.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags)
            )
        };
        let read = |addr: u64| {
            let bytes = crate::process::snapshot::read_memory(std::process::id(), addr, 8);
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        };
        let (frames, end) = tables.walk(Registers { ip, sp, bp }, read);
        (frames, end, ip)
    }

    #[test]
    fn a_thread_of_this_process_unwinds_to_its_start() {
        let tables = ProcessTables::build(std::process::id()).unwrap();
        // The test harness runs each test on a thread of its own: the walk goes through the
        // harness and the standard library to the thread's entry (`clone3`).
        let (frames, end, ip) = walk_here(&tables);
        let pid = std::process::id();
        let maps = crate::process::maps::ProcessMaps::capture(
            pid,
            pid,
            &crate::process::copies::CopyBudget::new(0),
        )
        .unwrap();
        let mut symbolizer = crate::symbolize::Symbolizer::new();
        let addrs: Vec<u64> = crate::symbolize::lookup_addresses(&frames).collect();
        symbolizer.prepare_user(&maps, addrs.iter().copied());
        let names: Vec<String> = addrs
            .iter()
            .map(|a| {
                symbolizer
                    .user(&maps, *a)
                    .last()
                    .map(|f| f.name.to_string())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(end, WalkEnd::Complete, "{names:?}");
        assert_eq!(frames[0], ip);
        // This function, then its caller, then on to the thread's entry.
        assert!(names[0].ends_with("walk_here"), "{names:?}");
        assert!(
            names[1].ends_with("a_thread_of_this_process_unwinds_to_its_start"),
            "{names:?}"
        );
        assert!(
            // `clone3` by libc's DWARF, `__clone3` by its symbol table.
            names
                .last()
                .is_some_and(|n| n.trim_start_matches("__").starts_with("clone")),
            "{names:?}"
        );
    }
}
