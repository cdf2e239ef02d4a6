//! Fills the kernel program's CFI maps for a target: its executable mappings, each pointing at
//! the unwind table of the object it maps, built once per file and shared by every process
//! and run that maps it.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::PathBuf,
};

use anyhow::{anyhow, Context};
use aya::maps::{HashMap, Map, MapData};
use procfs::process::{MMPermissions, MMapPath, MemoryMap, Process};
use profiler_common::{
    CfaRule, ProcessMappings, UnwindMapping, UnwindRow, MAX_UNWIND_MAPPINGS, MAX_UNWIND_ROWS,
};

use super::{
    table::{load_bias, CfiSource, UnwindTable},
    UnwindMode,
};

/// A file's identity for table sharing: its GNU build id, else device, inode and mtime (so a
/// rebuilt binary at the same path gets a new table).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    /// The GNU build id's bytes.
    BuildId(Vec<u8>),
    /// (device, inode, mtime in ns) of a file without a build id.
    Inode(u64, u64, i128),
    /// The vDSO of a kernel whose image carries no build id (the kernel's own images do):
    /// every process of one boot maps the same one.
    VdsoWithoutBuildId,
    /// CPython's perf trampolines (`-X perf`, `sys.activate_stack_trampoline`), which live in
    /// anonymous executable memory with no CFI: one table serves every arena.
    PythonTrampolines,
}

/// The code of one CPython perf trampoline on x86-64 (3.12 and 3.13): `sub $8,%rsp;
/// call *%rcx; add $8,%rsp; ret`. It keeps no frame pointer, so walking it by frame pointer
/// loses the stack; its one rule is written as a table instead.
const PYTHON_TRAMPOLINE: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
];

/// Whether the anonymous executable mapping at `start` of `pid` holds CPython trampolines.
fn is_python_trampoline_arena(pid: u32, start: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut code = [0u8; PYTHON_TRAMPOLINE.len()];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|mem| mem.read_exact_at(&mut code, start))
        .is_ok_and(|()| code == PYTHON_TRAMPOLINE)
}

/// Where a file's table sits in the kernel's row array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Resident {
    first_row: u32,
    rows: u32,
}

/// What loading one process's tables did, for logs, the summary and benches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Executable mappings given to the kernel.
    pub mappings: usize,
    /// Mappings whose object has a table (the rest unwind by frame pointer).
    pub with_table: usize,
    /// Tables built by this call (the others were already resident).
    pub tables_built: usize,
    /// Rows written by this call.
    pub rows_written: usize,
    /// Objects left to frame pointers because the row array is full.
    pub no_room: usize,
}

/// Addresses from here up are the kernel's (x86-64, 4- and 5-level paging alike).
const USER_ADDRESS_LIMIT: u64 = 1 << 63;

/// The kernel's CFI maps and the tables resident in them.
///
/// Memory bound: the kernel's row array (8-byte rows, 16 MiB by default, `--unwind-table-mib`)
/// holds every table; userspace keeps no copy of the rows, only one small entry per resident
/// file. When the array is full, further objects unwind by frame pointer (and are reported).
pub struct UnwindMaps {
    rows: memmap2::MmapMut,
    /// Keeps the row array's fd open while it is mapped.
    _rows_map: MapData,
    processes: HashMap<MapData, u32, ProcessMappings>,
    resident: StdHashMap<FileKey, Resident>,
    next_row: u32,
    /// Rows the kernel's array holds.
    capacity: u32,
    /// The mappings last given to the kernel, per process, to skip unchanged reloads.
    loaded: StdHashMap<u32, Vec<UnwindMapping>>,
    mode: UnwindMode,
    /// Files whose tables were built and found not to fit the row array (which never frees
    /// rows): remembered, so that each refresh of the maps does not build them again (seconds
    /// for a library of hundreds of MB).
    unfit: HashSet<FileKey>,
    /// Tables [`prebuild`] made, consumed by the [`Self::track_prebuilt`] call they came with.
    prebuilt: StdHashMap<FileKey, (UnwindTable, CfiSource)>,
}

/// Unwind tables built by [`prebuild`], away from the kernel program and whatever guards it.
#[derive(Default)]
pub struct Prebuilt(StdHashMap<FileKey, (UnwindTable, CfiSource)>);

/// Whether tracking `pid` in `mode` loads tables at all: not with `fp`, and not for a launched
/// command that has not exec'd yet (see [`UnwindMaps::track_maps`]).
pub fn would_track(pid: u32, mode: UnwindMode) -> bool {
    mode != UnwindMode::Fp && !is_unexeced_child(pid)
}

/// Builds the tables of the files `maps` (a read of `/proc/PID/maps` of `pid`) maps as code
/// whose keys are not in `resident` ([`UnwindMaps::resident_keys`]). This is the slow part of
/// tracking a process (seconds for a library of hundreds of MB) and needs no kernel map, so
/// a caller that shares the kernel program runs it without holding it. Failures are skipped
/// here: [`UnwindMaps::track_prebuilt`] builds those again and reports them as usual.
pub fn prebuild(
    pid: u32,
    maps: &[MemoryMap],
    resident: &HashSet<FileKey>,
    mode: UnwindMode,
) -> Prebuilt {
    let mut built = StdHashMap::new();
    if !would_track(pid, mode) {
        return Prebuilt(built);
    }
    for map in maps {
        let (start, end) = map.address;
        if !map.perms.contains(MMPermissions::EXECUTE)
            || start >= USER_ADDRESS_LIMIT
            || !matches!(map.pathname, MMapPath::Path(_))
        {
            continue;
        }
        let file = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
        let Ok(handle) = std::fs::File::open(&file) else {
            continue;
        };
        // SAFETY: read-only private mapping of a file the target maps too.
        let Ok(image) = (unsafe { memmap2::Mmap::map(&handle) }) else {
            continue;
        };
        let Ok(key) = file_key(&handle, &image) else {
            continue;
        };
        if resident.contains(&key) || built.contains_key(&key) {
            continue;
        }
        if let Ok(table) = UnwindTable::from_elf(&image) {
            built.insert(key, table);
        }
    }
    Prebuilt(built)
}

impl UnwindMaps {
    /// Wraps the program's `UNWIND_ROWS` and `UNWIND_PROCESSES` maps.
    pub fn new(rows: Map, processes: Map) -> anyhow::Result<UnwindMaps> {
        let rows_map = match rows {
            Map::Array(data) => data,
            other => return Err(anyhow!("UNWIND_ROWS is not an array: {other:?}")),
        };
        let capacity = rows_map
            .info()
            .map(|i| i.max_entries())
            .unwrap_or(MAX_UNWIND_ROWS);
        let len = capacity as usize * std::mem::size_of::<UnwindRow>();
        // SAFETY: the map was created with BPF_F_MMAPABLE and is `len` bytes long; the kernel
        // program only reads it.
        let rows = unsafe {
            memmap2::MmapOptions::new()
                .len(len)
                .map_mut(rows_map.fd().as_fd_raw())
        }
        .context("mapping the unwind row array")?;
        let processes = HashMap::try_from(processes).context("opening UNWIND_PROCESSES")?;
        Ok(UnwindMaps {
            rows,
            _rows_map: rows_map,
            processes,
            resident: StdHashMap::new(),
            next_row: 0,
            capacity,
            loaded: StdHashMap::new(),
            mode: super::default_mode(),
            unfit: HashSet::new(),
            prebuilt: StdHashMap::new(),
        })
    }

    /// Sets how the stacks of processes tracked from now on are walked.
    pub fn set_mode(&mut self, mode: UnwindMode) {
        self.mode = mode;
    }

    /// How stacks are walked.
    pub fn mode(&self) -> UnwindMode {
        self.mode
    }

    /// Loads (or refreshes, after dlopen or exec) the CFI tables of `pid` as the mode asks:
    /// nothing with `fp`; with `auto` a failure leaves the process to frame pointers with a
    /// warning; with `cfi` it is an error.
    pub fn track(&mut self, pid: u32) -> crate::error::Result<()> {
        self.track_maps(pid, None)
    }

    /// Like [`Self::track`], from the executable mappings of a read of `/proc/PID/maps` the
    /// caller already made ([`crate::procmaps::ProcessMaps::last_read`]); `None` or an empty
    /// list reads them here.
    pub fn track_maps(&mut self, pid: u32, maps: Option<&[MemoryMap]>) -> crate::error::Result<()> {
        if self.mode == UnwindMode::Fp || is_unexeced_child(pid) {
            return Ok(());
        }
        let loaded = match maps.filter(|m| !m.is_empty()) {
            Some(maps) => self.load_maps(pid, maps),
            None => self.load_process(pid),
        };
        match loaded {
            Ok(report) => {
                if report.tables_built > 0 {
                    log::info!(
                        "pid {pid}: unwind tables {report:?}, {} bytes resident",
                        self.resident_bytes()
                    );
                }
                Ok(())
            }
            Err(e) if self.mode == UnwindMode::Auto => {
                log::warn!("pid {pid}: no CFI unwinding, frame pointers only: {e:#}");
                Ok(())
            }
            Err(e) => Err(crate::error::Error::Kernel(e.context(format!(
                "loading the unwind tables of pid {pid} (--unwind cfi)"
            )))),
        }
    }

    /// The files whose tables need no build: resident, or known not to fit. What
    /// [`prebuild`] skips.
    pub fn resident_keys(&self) -> HashSet<FileKey> {
        self.resident.keys().chain(&self.unfit).cloned().collect()
    }

    /// [`Self::track_maps`] with the tables `prebuilt` holds written in instead of built here
    /// (those it lacks are built here).
    pub fn track_prebuilt(
        &mut self,
        pid: u32,
        maps: &[MemoryMap],
        prebuilt: Prebuilt,
    ) -> crate::error::Result<()> {
        self.prebuilt = prebuilt.0;
        let tracked = self.track_maps(pid, Some(maps));
        // Tables left over (resident meanwhile, or without room) are not kept.
        self.prebuilt = StdHashMap::new();
        tracked
    }

    /// Reads `/proc/PID/maps`, makes sure every mapped object's table is resident, and gives
    /// the kernel the process's executable mappings; from then on its stacks are walked by CFI.
    /// Call again when the process maps new code (dlopen, exec).
    pub fn load_process(&mut self, pid: u32) -> anyhow::Result<LoadReport> {
        let process = Process::new(pid as i32).with_context(|| format!("opening /proc/{pid}"))?;
        let maps = process
            .maps()
            .with_context(|| format!("reading /proc/{pid}/maps"))?;
        self.load_maps(pid, &maps.0)
    }

    /// [`Self::load_process`] from mappings of `pid` already read.
    pub fn load_maps(&mut self, pid: u32, maps: &[MemoryMap]) -> anyhow::Result<LoadReport> {
        let mut report = LoadReport::default();
        let mut mappings = Vec::new();
        for map in maps {
            let (start, end) = map.address;
            // `[vsyscall]` lies in the kernel's half of the address space: it is no user code
            // to unwind, and the kernel walk's branch-free bisection compares addresses by the
            // sign of their difference, which holds only within the user half.
            if !map.perms.contains(MMPermissions::EXECUTE) || start >= USER_ADDRESS_LIMIT {
                continue;
            }
            let mut mapping = UnwindMapping {
                start,
                end,
                ..UnwindMapping::default()
            };
            // The mapping's table: one synthetic row for CPython's perf trampolines, the image
            // in the target's memory for the vDSO, the file for everything else.
            let table = match &map.pathname {
                MMapPath::Anonymous if is_python_trampoline_arena(pid, start) => {
                    // A return address into a trampoline sits after its call, where the
                    // caller's frame is the 8 bytes it reserved plus the return address:
                    // CFA = rsp + 16.
                    let row = UnwindRow::new(0, CfaRule::Rsp, 16, None, 0).expect("a valid row");
                    Ok(self
                        .synthetic_table(FileKey::PythonTrampolines, row)
                        .map(|resident| (resident, start)))
                }
                MMapPath::Vdso => self
                    .vdso_table(pid, start, end, &mut report)
                    .with_context(|| format!("pid {pid}'s vDSO")),
                MMapPath::Path(path) => {
                    // map_files reaches the file whatever the target's mount namespace.
                    let file = PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"));
                    self.table_for(&file, start, map.offset, &mut report)
                        .with_context(|| path.display().to_string())
                }
                _ => Ok(None),
            };
            match table {
                Ok(Some((resident, bias))) => {
                    mapping.first_row = resident.first_row;
                    mapping.rows = resident.rows;
                    mapping.bias = bias;
                    report.with_table += usize::from(resident.rows > 0);
                }
                Ok(None) => {}
                Err(e) => log::debug!("no unwind table for {e:#}"),
            }
            mappings.push(mapping);
        }
        mappings.sort_by_key(|m| m.start);
        if mappings.len() > MAX_UNWIND_MAPPINGS {
            log::warn!(
                "pid {pid} has {} executable mappings; the CFI walk knows the first {MAX_UNWIND_MAPPINGS}",
                mappings.len()
            );
            mappings.truncate(MAX_UNWIND_MAPPINGS);
        }
        let mut value = ProcessMappings {
            len: mappings.len() as u64,
            mappings: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
        };
        value.mappings[..mappings.len()].copy_from_slice(&mappings);
        report.mappings = mappings.len();
        if self.loaded.get(&pid) != Some(&mappings) {
            self.processes
                .insert(pid, value, 0)
                .context("registering the process's mappings")?;
            self.loaded.insert(pid, mappings);
        }
        Ok(report)
    }

    /// Whether the kernel walks `pid` by CFI (its mappings are loaded).
    pub fn is_tracked(&self, pid: u32) -> bool {
        self.loaded.contains_key(&pid)
    }

    /// Stops walking `pid` by CFI; its tables stay resident for other processes and runs.
    pub fn unload_process(&mut self, pid: u32) {
        self.loaded.remove(&pid);
        let _ = self.processes.remove(&pid);
    }

    /// Bytes of the row array in use.
    pub fn resident_bytes(&self) -> usize {
        self.next_row as usize * std::mem::size_of::<UnwindRow>()
    }

    /// The resident one-row table under `key`, written on first use; `None` without room.
    fn synthetic_table(&mut self, key: FileKey, row: UnwindRow) -> Option<Resident> {
        if let Some(resident) = self.resident.get(&key) {
            return Some(*resident);
        }
        if self.next_row >= self.capacity {
            return None;
        }
        let resident = Resident {
            first_row: self.next_row,
            rows: 1,
        };
        let size = std::mem::size_of::<UnwindRow>();
        let at = resident.first_row as usize * size;
        // SAFETY: UnwindRow is plain #[repr(C)] data without padding.
        let src =
            unsafe { std::slice::from_raw_parts((&row as *const UnwindRow).cast::<u8>(), size) };
        self.rows[at..at + size].copy_from_slice(src);
        self.next_row += 1;
        self.resident.insert(key, resident);
        Some(resident)
    }

    /// The resident table of the object behind `file` and the mapping's load bias, building
    /// and writing the table on first sight; `None` when there is no room for it.
    fn table_for(
        &mut self,
        file: &std::path::Path,
        start: u64,
        offset: u64,
        report: &mut LoadReport,
    ) -> anyhow::Result<Option<(Resident, u64)>> {
        let handle =
            std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        // SAFETY: read-only private mapping of a file the target maps too.
        let image = unsafe { memmap2::Mmap::map(&handle) }.context("mapping the object")?;
        let bias = load_bias(&image, start, offset)?;
        let key = file_key(&handle, &image)?;
        Ok(self
            .resident_table(key, &image, &file.display().to_string(), report)?
            .map(|resident| (resident, bias)))
    }

    /// The resident table of the vDSO mapped at `start..end` of `pid`, and its load bias. The
    /// vDSO has no file: its ELF image is read from the process's memory, and its table is
    /// built once per kernel (by the image's build id) for every process.
    fn vdso_table(
        &mut self,
        pid: u32,
        start: u64,
        end: u64,
        report: &mut LoadReport,
    ) -> anyhow::Result<Option<(Resident, u64)>> {
        let image = crate::vdso::read_image(pid, start, end)?;
        let bias = load_bias(&image, start, 0)?;
        let key = {
            use object::Object;
            let elf = object::File::parse(&*image).context("parsing the vDSO's ELF headers")?;
            match elf.build_id() {
                Ok(Some(id)) => FileKey::BuildId(id.to_vec()),
                _ => FileKey::VdsoWithoutBuildId,
            }
        };
        Ok(self
            .resident_table(key, &image, crate::procmaps::VDSO, report)?
            .map(|resident| (resident, bias)))
    }

    /// The resident table under `key`, built from the ELF image `image` (named `name` in
    /// logs) and written into the row array on first sight; `None` when there is no room.
    fn resident_table(
        &mut self,
        key: FileKey,
        image: &[u8],
        name: &str,
        report: &mut LoadReport,
    ) -> anyhow::Result<Option<Resident>> {
        if let Some(resident) = self.resident.get(&key) {
            return Ok(Some(*resident));
        }
        if self.unfit.contains(&key) {
            report.no_room += 1;
            return Ok(None);
        }
        let (table, source) = match self.prebuilt.remove(&key) {
            Some(prebuilt) => prebuilt,
            None => UnwindTable::from_elf(image)?,
        };
        let rows = table.rows.len() as u32;
        if u64::from(self.next_row) + u64::from(rows) > u64::from(self.capacity) {
            report.no_room += 1;
            log::warn!(
                "the unwind row array is full ({} rows, {} MiB; --unwind-table-mib raises it): \
                 {name} ({rows} rows) unwinds by frame pointer",
                self.capacity,
                (u64::from(self.capacity) * 8) >> 20
            );
            self.unfit.insert(key);
            return Ok(None);
        }
        let resident = Resident {
            first_row: self.next_row,
            rows,
        };
        let bytes = table.bytes();
        let at = resident.first_row as usize * std::mem::size_of::<UnwindRow>();
        // SAFETY: UnwindRow is plain #[repr(C)] data without padding.
        let src = unsafe { std::slice::from_raw_parts(table.rows.as_ptr().cast::<u8>(), bytes) };
        self.rows[at..at + bytes].copy_from_slice(src);
        self.next_row += rows;
        self.resident.insert(key, resident);
        report.tables_built += 1;
        report.rows_written += rows as usize;
        log::debug!("unwind table for {name}: {rows} rows from {source:?}");
        Ok(Some(resident))
    }
}

/// Whether `pid` still runs bpfprof's own image: a launched command between fork and exec.
/// Its tables are loaded after the exec; building bpfprof's own would only delay the command.
fn is_unexeced_child(pid: u32) -> bool {
    let id = |path: String| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    pid != std::process::id()
        && id(format!("/proc/{pid}/exe"))
            .is_some_and(|child| id("/proc/self/exe".into()) == Some(child))
}

/// The identity under which `file`'s table is shared.
fn file_key(file: &std::fs::File, image: &[u8]) -> anyhow::Result<FileKey> {
    use object::Object;
    let elf = object::File::parse(image).context("parsing the ELF headers")?;
    if let Ok(Some(id)) = elf.build_id() {
        return Ok(FileKey::BuildId(id.to_vec()));
    }
    let meta = file.metadata().context("stat")?;
    Ok(FileKey::Inode(
        meta.dev(),
        meta.ino(),
        i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    ))
}

/// Raw fd of a borrowed map fd, for mmap.
trait AsFdRaw {
    fn as_fd_raw(&self) -> std::os::fd::RawFd;
}

impl<T: std::os::fd::AsFd> AsFdRaw for T {
    fn as_fd_raw(&self) -> std::os::fd::RawFd {
        self.as_fd().as_raw_fd()
    }
}
