//! Fills the kernel program's CFI maps for a target: its executable mappings, each pointing at
//! the unwind table of the object it maps, built once per file and shared by every process
//! and run that maps it.

use std::{
    collections::HashMap as StdHashMap,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context};
use aya::maps::{HashMap, Map, MapData};
use procfs::process::{MMPermissions, MMapPath, MemoryMap, Process};
use profiler_common::{
    CfaRule, ProcessMappings, UnwindMapping, UnwindRow, MAX_UNWIND_MAPPINGS, MAX_UNWIND_ROWS,
};

use super::{
    builder::{BuildPriority, Builder, Built, Image, Job, Owner},
    cache::TableCache,
    table::{load_bias, UnwindTable},
    UnwindMode,
};

/// An object's identity for table sharing: what the daemon verified itself of the file it
/// opened, never what the file says of itself. A GNU build id is whatever its linker wrote:
/// keyed by it, a user's fake library carrying libc's build id and bogus CFI gave every other
/// user's processes its table for libc (149 of 149 of their stacks lost `_start`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    /// A file, by its device, inode, size, mtime and ctime (in ns) and owner: a user can
    /// neither give its file another file's inode nor set its ctime (only the kernel does),
    /// and a rebuilt or rewritten file gets a new key.
    File {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
        /// `st_size`.
        size: u64,
        /// `st_mtime` in ns.
        mtime: i128,
        /// `st_ctime` in ns.
        ctime: i128,
        /// `st_uid`.
        uid: u32,
    },
    /// The vDSO of the processes of user `uid`, by its image's build id (if any): a process
    /// may write to its own vDSO (it is mapped may-write, for debuggers), so its table is
    /// shared only among processes of the same user.
    Vdso {
        /// The image's GNU build id, empty when it has none.
        build_id: Vec<u8>,
        /// The effective uid of the process it was read from.
        uid: u32,
    },
    /// CPython's perf trampolines (`-X perf`, `sys.activate_stack_trampoline`), which live in
    /// anonymous executable memory with no CFI: one table serves every arena.
    PythonTrampolines,
}

impl FileKey {
    /// The key of the file whose metadata (from the opened handle, `fstat`) is `meta`.
    pub fn of_file(meta: &std::fs::Metadata) -> FileKey {
        let ns = |secs: i64, nsec: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsec);
        FileKey::File {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: ns(meta.mtime(), meta.mtime_nsec()),
            ctime: ns(meta.ctime(), meta.ctime_nsec()),
            uid: meta.uid(),
        }
    }
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

/// Addresses from here up are the kernel's (x86-64, 4- and 5-level paging alike).
const USER_ADDRESS_LIMIT: u64 = 1 << 63;

/// Rows one table may have: the kernel walk bisects a table in
/// [`profiler_common::UNWIND_TABLE_SEARCH_STEPS`] steps.
const MAX_ROWS_PER_TABLE: u32 = 1 << profiler_common::UNWIND_TABLE_SEARCH_STEPS;

/// A table sampled this recently is never evicted to make room for another: two hot objects
/// that do not fit together would otherwise evict each other, and each be built again, on
/// every refresh.
const RECENTLY_SAMPLED: Duration = Duration::from_secs(10);

/// Rows above which an object's table is built only once a sample runs in it: 256k rows take
/// about 20 ms to build and 2 MiB to hold, which covers an executable, libc, libstdc++ and
/// libpython; PyTorch's seventy objects need 80 MiB, most of it for CUDA libraries a CPU
/// run never enters, and building them all took 4.8 s of CPU beside the target.
const EAGER_MAX_ROWS: u64 = 256 * 1024;

/// Where an object's table stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableState {
    /// Waiting for (or in) the build thread.
    Queued,
    /// Large, or more than the free room: built once a sample runs in it.
    OnDemand {
        /// Its rows, estimated from the size of its call frame information.
        estimated_rows: u32,
    },
    /// In the kernel's row array.
    Resident {
        /// Its first row in the array.
        first_row: u32,
        /// Its rows.
        rows: u32,
    },
    /// Built, but the row array had no room: built again only when it is sampled and room
    /// can be made for its known size, never on a timer.
    NoRoom {
        /// The rows it needs.
        rows: u32,
    },
    /// Evicted to make room for a table sampled more recently; built again when sampled.
    Evicted {
        /// The rows it needs.
        rows: u32,
    },
    /// No table can be made for this file (no CFI, unreadable, not x86-64, too large for the
    /// walk's search): decided once, until the file changes (a new [`FileKey`]).
    Unavailable {
        /// Why.
        why: String,
    },
}

impl TableState {
    /// Why an object in this state has no table, in words.
    pub fn describe(&self) -> String {
        match self {
            TableState::Queued => "its table was still being built".into(),
            TableState::OnDemand { .. } => {
                "its table is built once it is sampled, and was not built yet".into()
            }
            TableState::Resident { .. } => "it has a table".into(),
            TableState::NoRoom { rows } | TableState::Evicted { rows } => format!(
                "no room in the unwind row array for its {} MiB table (--unwind-table-mib)",
                (u64::from(*rows) * 8).div_ceil(1 << 20)
            ),
            TableState::Unavailable { why } => why.clone(),
        }
    }
}

/// One object's table and what is known of it.
struct Table {
    state: TableState,
    /// The object's path as the target maps it, for warnings and the summary.
    name: String,
    /// When a sample was last seen in it: `None` for a table built because the object is
    /// mapped, before any sample ran its code.
    last_sampled: Option<Instant>,
    /// When a sample first ran in it while it had no table in the kernel, since it last had
    /// one: the frames there were walked by frame pointer or a stack scan.
    sampled_untabled: Option<Instant>,
    /// When its table last went into the kernel.
    resident_since: Option<Instant>,
    /// Whether its lack of a table was reported.
    warned: bool,
}

/// One executable mapping of a tracked process.
#[derive(Clone, Debug)]
struct TrackedMapping {
    start: u64,
    end: u64,
    bias: u64,
    /// The object's identity; `None` when it has no file the walk can use (anonymous
    /// memory, a file that could not be read).
    key: Option<FileKey>,
    /// Where the object can be opened again (its `/proc/PID/map_files` entry).
    source: Option<PathBuf>,
}

/// What identifies an executable mapping's contents: address range, file offset, device
/// (major, minor) and inode.
type MappingSignature = (u64, u64, u64, (i32, i32), u64);

/// A process whose stacks the kernel walks by CFI.
#[derive(Default)]
struct Tracked {
    /// Whom its tables are built for (see [`UnwindMaps::track_maps`]).
    owner: Owner,
    /// What its executable mappings were at the last read (address range, file offset,
    /// device, inode): an unchanged read costs nothing more.
    signature: Vec<MappingSignature>,
    /// Its executable mappings, by address.
    mappings: Vec<TrackedMapping>,
    /// The mappings last given to the kernel.
    written: Vec<UnwindMapping>,
}

/// An object a process maps that has no table in the kernel, for the run's summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untabled {
    /// Where the process maps it.
    pub start: u64,
    /// End of the mapping.
    pub end: u64,
    /// The object's path.
    pub name: String,
    /// Its table's state.
    pub state: TableState,
}

/// The kernel's CFI maps, the tables resident in them, and the thread that builds tables.
///
/// Tables are built on the build threads, never on the caller's: every object a tracked
/// process maps is queued for the process's owner (smallest first), an object its samples run
/// in goes to the front of that owner's queue, owners are served fairly (see the builder), and
/// finished tables are installed by [`Self::poll`]. The row array (8-byte rows,
/// `--unwind-table-mib`) is the memory bound: when a sampled object's table does not fit, the
/// tables sampled least recently (never-sampled ones first) are evicted for it. Userspace keeps
/// no copy of the rows. What cannot be loaded is decided once per file and never rebuilt on a
/// timer.
pub struct UnwindMaps {
    /// The row array, mapped only while a table is written into it: a mapping of the whole
    /// array would count all of it in bpfprof's resident memory.
    rows_map: MapData,
    processes: HashMap<MapData, u32, ProcessMappings>,
    /// Rows the kernel's array holds.
    capacity: u32,
    tables: StdHashMap<FileKey, Table>,
    tracked: StdHashMap<u32, Tracked>,
    /// Started on the first table to build.
    builder: Option<Builder>,
    mode: UnwindMode,
    /// Whether the build threads yield to the rest of the process.
    priority: BuildPriority,
    /// Where the build threads read and file tables (see [`super::cache`]).
    cache: Option<Arc<TableCache>>,
    /// What the tables cost so far: (tables built, rows built, build time).
    built: (usize, u64, Duration),
    /// How many of the tables built were read from the cache.
    from_cache: usize,
    /// Tables evicted so far to make room for sampled ones (the array's cap hit).
    evictions: u64,
}

impl UnwindMaps {
    /// Wraps the program's `UNWIND_ROWS` and `UNWIND_PROCESSES` maps.
    pub fn new(
        rows: Map,
        processes: Map,
        mode: UnwindMode,
        priority: BuildPriority,
    ) -> anyhow::Result<UnwindMaps> {
        let rows_map = match rows {
            Map::Array(data) => data,
            other => return Err(anyhow!("UNWIND_ROWS is not an array: {other:?}")),
        };
        let capacity = rows_map
            .info()
            .map(|i| i.max_entries())
            .unwrap_or(MAX_UNWIND_ROWS);
        let processes = HashMap::try_from(processes).context("opening UNWIND_PROCESSES")?;
        Ok(UnwindMaps {
            rows_map,
            processes,
            capacity,
            tables: StdHashMap::new(),
            tracked: StdHashMap::new(),
            builder: None,
            mode,
            priority,
            cache: None,
            built: (0, 0, Duration::ZERO),
            from_cache: 0,
            evictions: 0,
        })
    }

    /// Reads and files tables in `cache` (set before the first build; a build thread
    /// started without one keeps building every table).
    pub fn set_cache(&mut self, cache: Option<Arc<TableCache>>) {
        self.cache = cache;
    }

    /// Sets how the stacks of processes tracked from now on are walked.
    pub fn set_mode(&mut self, mode: UnwindMode) {
        self.mode = mode;
    }

    /// How stacks are walked.
    pub fn mode(&self) -> UnwindMode {
        self.mode
    }

    /// Gives the kernel the executable mappings of `pid` and queues the tables of the objects
    /// it maps, as the mode asks: nothing with `fp`; with `auto` a failure leaves the process
    /// to frame pointers with a warning; with `cfi` it is an error. Call again when the process
    /// maps new code (dlopen, exec); an unchanged memory map costs a comparison. `maps` is a
    /// read of `/proc/PID/maps` the caller already made
    /// ([`crate::process::maps::ProcessMaps::last_read`]); `None` or an empty list reads it here.
    /// `owner` is the uid of the run's owner (0 for root and the command line): the tables
    /// its processes need are built in its turn, beside other owners' (see the builder).
    pub fn track_maps(
        &mut self,
        pid: u32,
        owner: u32,
        maps: Option<&[MemoryMap]>,
    ) -> crate::error::Result<()> {
        if self.mode == UnwindMode::Fp || is_unexeced_child(pid) {
            return Ok(());
        }
        let read;
        let maps = match maps.filter(|m| !m.is_empty()) {
            Some(maps) => maps,
            None => {
                read = Process::new(pid as i32)
                    .and_then(|p| p.maps())
                    .with_context(|| format!("reading /proc/{pid}/maps"));
                match &read {
                    Ok(maps) => &maps.0[..],
                    Err(e) => return self.refused(pid, anyhow!("{e:#}")),
                }
            }
        };
        self.poll();
        match self.load_maps(pid, owner, maps) {
            Ok(()) => Ok(()),
            Err(e) => self.refused(pid, e),
        }
    }

    /// What a target whose tables cannot be loaded gets: frame pointers with `auto`, an error
    /// with `cfi`.
    fn refused(&self, pid: u32, e: anyhow::Error) -> crate::error::Result<()> {
        if self.mode == UnwindMode::Cfi {
            return Err(crate::error::Error::Kernel(e.context(format!(
                "loading the unwind tables of pid {pid} (--unwind cfi)"
            ))));
        }
        log::warn!("pid {pid}: no CFI unwinding, frame pointers only: {e:#}");
        Ok(())
    }

    /// Waits until every table `pid` maps is built (installed or found unavailable), or until
    /// `deadline`: a run on a running process then starts with whole stacks where the build
    /// is quick, and without waiting for a huge object, whose table comes later.
    pub fn settle(&mut self, pid: u32, deadline: Instant) {
        loop {
            self.poll();
            if !self.pending(pid) {
                return;
            }
            let Some(built) = self
                .builder
                .as_ref()
                .and_then(|b| b.wait_finished(deadline))
            else {
                return;
            };
            self.install(built);
        }
    }

    /// Whether a table `pid` maps is still queued for the build thread.
    pub fn pending(&self, pid: u32) -> bool {
        self.tracked.get(&pid).is_some_and(|t| {
            t.mappings.iter().any(|m| {
                m.key.as_ref().is_some_and(|k| {
                    self.tables
                        .get(k)
                        .is_some_and(|t| t.state == TableState::Queued)
                })
            })
        })
    }

    /// Whether a table is queued or waits for a sample to be built: until none does, the
    /// caller should report sampled addresses ([`Self::note_sampled`]) soon, since an object
    /// sampled meanwhile is walked without its table.
    pub fn awaits_samples(&self) -> bool {
        self.tables
            .values()
            .any(|t| matches!(t.state, TableState::Queued | TableState::OnDemand { .. }))
    }

    /// Installs the tables built since the last call; call it often (every tick).
    pub fn poll(&mut self) {
        let finished = match &self.builder {
            Some(builder) => builder.finished(),
            None => return,
        };
        for built in finished {
            self.install(built);
        }
    }

    /// Notes that a target ran at these user addresses (a stack the kernel recorded): objects
    /// without a table are built first, and resident tables are kept over unsampled ones.
    pub fn note_sampled(&mut self, ips: impl IntoIterator<Item = u64>) {
        let now = Instant::now();
        let mut hit: Vec<(FileKey, Owner)> = Vec::new();
        for ip in ips {
            if ip == 0 || ip >= USER_ADDRESS_LIMIT {
                continue;
            }
            for tracked in self.tracked.values() {
                let at = tracked.mappings.partition_point(|m| m.start <= ip);
                let Some(m) = at.checked_sub(1).map(|i| &tracked.mappings[i]) else {
                    continue;
                };
                if ip < m.end {
                    if let Some(key) = &m.key {
                        let hit_by = (key.clone(), tracked.owner);
                        if !hit.contains(&hit_by) {
                            hit.push(hit_by);
                        }
                    }
                }
            }
        }
        for (key, owner) in hit {
            self.sampled(key, owner, now);
        }
    }

    /// An object `key` was sampled at `now` in a process of `owner`.
    fn sampled(&mut self, key: FileKey, owner: Owner, now: Instant) {
        let Some(table) = self.tables.get_mut(&key) else {
            return;
        };
        table.last_sampled = Some(now);
        if !matches!(table.state, TableState::Resident { .. }) {
            table.sampled_untabled.get_or_insert(now);
        }
        let rows = match table.state {
            TableState::Queued => {
                if let Some(builder) = &self.builder {
                    builder.promote(&key, owner);
                }
                return;
            }
            TableState::NoRoom { rows } | TableState::Evicted { rows } => rows,
            TableState::OnDemand { estimated_rows } => estimated_rows,
            TableState::Resident { .. } | TableState::Unavailable { .. } => return,
        };
        // Built again only when it will fit: its size is known, so no build is wasted.
        if !self.can_make_room(rows, now) {
            let state = if rows > self.capacity {
                TableState::Unavailable {
                    why: format!(
                        "its table (about {} MiB) is larger than the unwind row array ({} MiB; \
                         --unwind-table-mib raises it)",
                        (u64::from(rows) * 8).div_ceil(1 << 20),
                        self.capacity_bytes() >> 20
                    ),
                }
            } else {
                TableState::NoRoom { rows }
            };
            self.decide(&key, state);
            return;
        }
        let source = self
            .tracked
            .values()
            .flat_map(|t| &t.mappings)
            .find(|m| m.key.as_ref() == Some(&key))
            .and_then(|m| m.source.clone());
        let Some((image, _)) =
            source.and_then(|s| crate::process::target_file::open_proc_link(&s).ok())
        else {
            return;
        };
        self.submit(key, Image::File(image), 0, owner, true);
    }

    /// Stops walking `pid` by CFI; its tables stay resident for other processes and runs.
    pub fn unload_process(&mut self, pid: u32) {
        if self.tracked.remove(&pid).is_some() {
            let _ = self.processes.remove(&pid);
        }
    }

    /// Tables evicted so far to make room for sampled ones.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether the kernel walks `pid` by CFI (its mappings are loaded).
    pub fn is_tracked(&self, pid: u32) -> bool {
        self.tracked.contains_key(&pid)
    }

    /// Bytes of the row array in use.
    pub fn resident_bytes(&self) -> usize {
        self.resident()
            .map(|(_, rows)| rows as usize)
            .sum::<usize>()
            * std::mem::size_of::<UnwindRow>()
    }

    /// Bytes the row array holds.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity as usize * std::mem::size_of::<UnwindRow>()
    }

    /// Tables built so far, their rows and the time the build thread spent on them.
    pub fn build_cost(&self) -> (usize, u64, Duration) {
        self.built
    }

    /// How many of the tables built so far were read from the on-disk cache.
    pub fn tables_from_cache(&self) -> usize {
        self.from_cache
    }

    /// The state of the table of the object at `path`'s key, for tests and benches.
    pub fn table_state(&self, key: &FileKey) -> Option<&TableState> {
        self.tables.get(key).map(|t| &t.state)
    }

    /// The objects `pid` maps whose code has no table in the kernel (their frames unwind by
    /// frame pointer), for the run's summary.
    pub fn untabled(&self, pid: u32) -> Vec<Untabled> {
        let Some(tracked) = self.tracked.get(&pid) else {
            return Vec::new();
        };
        tracked
            .mappings
            .iter()
            .filter_map(|m| {
                let table = self.tables.get(m.key.as_ref()?)?;
                (!matches!(table.state, TableState::Resident { .. })).then(|| Untabled {
                    start: m.start,
                    end: m.end,
                    name: table.name.clone(),
                    state: table.state.clone(),
                })
            })
            .collect()
    }

    /// The objects `pid` maps whose table went into the kernel after `since` although samples
    /// had run in them before (their frames walked by frame pointer or a stack scan until
    /// then), with when it went in: for the summary of a run that started at `since`.
    pub fn tabled_late(&self, pid: u32, since: Instant) -> Vec<(String, Instant)> {
        let Some(tracked) = self.tracked.get(&pid) else {
            return Vec::new();
        };
        let mut late: Vec<(String, Instant)> = tracked
            .mappings
            .iter()
            .filter_map(|m| {
                let table = self.tables.get(m.key.as_ref()?)?;
                let resident = table.resident_since?;
                (resident > since && table.sampled_untabled.is_some_and(|at| at < resident))
                    .then(|| (table.name.clone(), resident))
            })
            .collect();
        late.sort();
        late.dedup_by(|a, b| a.0 == b.0);
        late
    }

    /// Reads `pid`'s executable mappings and gives them to the kernel, queueing the tables of
    /// objects not seen before.
    fn load_maps(&mut self, pid: u32, owner: Owner, maps: &[MemoryMap]) -> anyhow::Result<()> {
        let mut executable: Vec<&MemoryMap> = maps
            .iter()
            // `[vsyscall]` lies in the kernel's half of the address space: it is no user code
            // to unwind, and the kernel walk's branch-free bisection compares addresses by the
            // sign of their difference, which holds only within the user half.
            .filter(|m| {
                m.perms.contains(MMPermissions::EXECUTE) && m.address.0 < USER_ADDRESS_LIMIT
            })
            .collect();
        // The kernel walk knows the first MAX_UNWIND_MAPPINGS (by address): only those are
        // opened, so that a process with 60,000 executable mappings costs no more than one
        // with 256 (each is an open, a read of its headers and a key).
        executable.sort_by_key(|m| m.address.0);
        let over = executable.len().saturating_sub(MAX_UNWIND_MAPPINGS);
        executable.truncate(MAX_UNWIND_MAPPINGS);
        let signature: Vec<_> = executable
            .iter()
            .map(|m| (m.address.0, m.address.1, m.offset, m.dev, m.inode))
            .collect();
        if self
            .tracked
            .get(&pid)
            .is_some_and(|t| t.signature == signature && t.owner == owner)
        {
            return Ok(());
        }
        let mut mappings = Vec::with_capacity(executable.len());
        for map in executable {
            let (start, end) = map.address;
            let mapping = match &map.pathname {
                MMapPath::Anonymous if is_python_trampoline_arena(pid, start) => {
                    self.python_trampolines();
                    Ok(TrackedMapping {
                        start,
                        end,
                        bias: start,
                        key: Some(FileKey::PythonTrampolines),
                        source: None,
                    })
                }
                MMapPath::Vdso => self
                    .vdso(pid, owner, start, end)
                    .with_context(|| format!("pid {pid}'s vDSO")),
                MMapPath::Path(path) => {
                    // map_files reaches the file whatever the target's mount namespace.
                    let source = PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"));
                    self.object(
                        &source,
                        (start, end),
                        map.offset,
                        &path.display().to_string(),
                        owner,
                    )
                    .with_context(|| path.display().to_string())
                }
                _ => Err(anyhow!("no file")),
            };
            mappings.push(mapping.unwrap_or_else(|e| {
                log::debug!("no unwind table for {e:#}");
                TrackedMapping {
                    start,
                    end,
                    bias: 0,
                    key: None,
                    source: None,
                }
            }));
        }
        mappings.sort_by_key(|m| m.start);
        if over > 0 {
            log::warn!(
                "pid {pid} has {} executable mappings; the CFI walk knows the first {MAX_UNWIND_MAPPINGS}",
                over + MAX_UNWIND_MAPPINGS
            );
        }
        let tracked = self.tracked.entry(pid).or_default();
        tracked.owner = owner;
        tracked.signature = signature;
        tracked.mappings = mappings;
        // A new process is registered even with no table yet: its walk then takes frame
        // pointers through the objects still being built.
        tracked.written.clear();
        self.write_process(pid)
    }

    /// Gives the kernel `pid`'s mappings with the tables resident now, when they changed.
    fn write_process(&mut self, pid: u32) -> anyhow::Result<()> {
        let Some(tracked) = self.tracked.get(&pid) else {
            return Ok(());
        };
        let mappings: Vec<UnwindMapping> = tracked
            .mappings
            .iter()
            .map(|m| {
                let mut mapping = UnwindMapping {
                    start: m.start,
                    end: m.end,
                    ..UnwindMapping::default()
                };
                let resident = m.key.as_ref().and_then(|k| self.tables.get(k));
                if let Some(Table {
                    state: TableState::Resident { first_row, rows },
                    ..
                }) = resident
                {
                    mapping.first_row = *first_row;
                    mapping.rows = *rows;
                    mapping.bias = m.bias;
                }
                mapping
            })
            .collect();
        if !tracked.written.is_empty() && tracked.written == mappings {
            return Ok(());
        }
        let mut value = ProcessMappings {
            len: mappings.len() as u64,
            mappings: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
        };
        value.mappings[..mappings.len()].copy_from_slice(&mappings);
        self.processes
            .insert(pid, value, 0)
            .context("registering the process's mappings")?;
        if let Some(tracked) = self.tracked.get_mut(&pid) {
            tracked.written = mappings;
        }
        Ok(())
    }

    /// Rewrites the kernel's mappings of every process that maps `key`.
    fn write_processes_of(&mut self, key: &FileKey) {
        let pids: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.mappings.iter().any(|m| m.key.as_ref() == Some(key)))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in pids {
            if let Err(e) = self.write_process(pid) {
                log::debug!("pid {pid}: {e:#}");
            }
        }
    }

    /// The mapping of an object file, its table queued for `owner` when the file is new or
    /// still queued (for another owner, maybe).
    fn object(
        &mut self,
        source: &std::path::Path,
        (start, end): (u64, u64),
        offset: u64,
        name: &str,
        owner: Owner,
    ) -> anyhow::Result<TrackedMapping> {
        // A FIFO, a device or a directory mapped executable is nothing to read.
        let (handle, _) = crate::process::target_file::open_proc_link(source)
            .with_context(|| format!("opening {}", source.display()))?;
        let meta = handle.metadata().context("stat")?;
        if !meta.is_file() {
            return Err(anyhow!("not a regular file"));
        }
        // Read by pread, not mapped: the target's user may truncate the file meanwhile.
        let image = crate::process::target_file::ElfReader::new(handle.try_clone()?);
        let bias = load_bias(&image, start, offset).map_err(|e| image.explain(e))?;
        let key = FileKey::of_file(&meta);
        if !self.tables.contains_key(&key) {
            self.new_table(key.clone(), name);
            let estimate = super::table::estimate_rows(&image);
            let fits = self
                .free_range(estimate.min(u64::from(u32::MAX)) as u32)
                .is_some();
            if estimate <= EAGER_MAX_ROWS && fits {
                self.submit(key.clone(), Image::File(handle), meta.len(), owner, false);
            } else {
                let estimated_rows = estimate.min(u64::from(u32::MAX)) as u32;
                self.decide(&key, TableState::OnDemand { estimated_rows });
            }
        } else if let Some(builder) = &self.builder {
            // Queued for another process, maybe another owner's: this owner waits for it in
            // its own turn, not behind that owner's queue.
            builder.want(&key, owner);
        }
        Ok(TrackedMapping {
            start,
            end,
            bias,
            key: Some(key),
            source: Some(source.to_path_buf()),
        })
    }

    /// The vDSO's mapping. The vDSO has no file: its ELF image is read from the process's
    /// memory, and its table is built once per kernel (by the image's build id).
    fn vdso(
        &mut self,
        pid: u32,
        owner: Owner,
        start: u64,
        end: u64,
    ) -> anyhow::Result<TrackedMapping> {
        let image = crate::process::vdso::read_image(pid, start, end)?;
        let bias = load_bias(image.as_slice(), start, 0)?;
        let key = {
            use object::Object;
            let elf = object::File::parse(&*image).context("parsing the vDSO's ELF headers")?;
            // The owner of /proc/PID is the process's effective uid: who may write to it.
            let uid = std::fs::metadata(format!("/proc/{pid}"))
                .context("stat of the process")?
                .uid();
            FileKey::Vdso {
                build_id: elf.build_id().ok().flatten().unwrap_or_default().to_vec(),
                uid,
            }
        };
        if !self.tables.contains_key(&key) {
            self.new_table(key.clone(), crate::process::maps::VDSO);
            let size = image.len() as u64;
            self.submit(
                key.clone(),
                Image::Memory(image.to_vec()),
                size,
                owner,
                false,
            );
        }
        Ok(TrackedMapping {
            start,
            end,
            bias,
            key: Some(key),
            source: None,
        })
    }

    /// The one-row table of CPython's perf trampolines, written on first use.
    fn python_trampolines(&mut self) {
        let key = FileKey::PythonTrampolines;
        if self.tables.contains_key(&key) {
            return;
        }
        self.new_table(key.clone(), "[python perf trampolines]");
        // A return address into a trampoline sits after its call, where the caller's frame is
        // the 8 bytes it reserved plus the return address: CFA = rsp + 16.
        let row = UnwindRow::new(0, CfaRule::Rsp, 16, None, 0).expect("a valid row");
        self.install(Built {
            key,
            table: Ok(UnwindTable { rows: vec![row] }),
            took: Duration::ZERO,
            cpu: Duration::ZERO,
            boosted: false,
            cached: false,
        });
    }

    fn new_table(&mut self, key: FileKey, name: &str) {
        self.tables.insert(
            key,
            Table {
                state: TableState::Queued,
                name: name.to_string(),
                last_sampled: None,
                sampled_untabled: None,
                resident_since: None,
                warned: false,
            },
        );
    }

    /// Hands a table to the build threads (started on first use), in `owner`'s queue.
    fn submit(&mut self, key: FileKey, image: Image, size: u64, owner: Owner, urgent: bool) {
        if self.builder.is_none() {
            match Builder::spawn(self.priority, self.cache.clone()) {
                Ok(builder) => self.builder = Some(builder),
                Err(e) => {
                    self.decide(
                        &key,
                        TableState::Unavailable {
                            why: format!("no thread to build tables: {e}"),
                        },
                    );
                    return;
                }
            }
        }
        if let Some(table) = self.tables.get_mut(&key) {
            table.state = TableState::Queued;
        }
        if let Some(builder) = &self.builder {
            builder.submit(Job { key, image, size }, owner, urgent);
        }
    }

    /// Puts a finished build in the row array, or notes why it is not there.
    fn install(&mut self, built: Built) {
        let Built {
            key,
            table,
            took,
            cpu,
            boosted,
            cached,
        } = built;
        let Some(entry) = self.tables.get(&key) else {
            return;
        };
        let sampled = entry.last_sampled.is_some();
        let table = match table {
            Ok(table) => table,
            Err(e) => {
                self.decide(
                    &key,
                    TableState::Unavailable {
                        why: format!("{e:#}"),
                    },
                );
                return;
            }
        };
        self.built.0 += 1;
        self.built.1 += table.rows.len() as u64;
        self.built.2 += took;
        self.from_cache += usize::from(cached);
        let rows = table.rows.len() as u32;
        if table.rows.is_empty() {
            self.decide(
                &key,
                TableState::Unavailable {
                    why: "it has no call frame information".into(),
                },
            );
            return;
        }
        if table.rows.len() > MAX_ROWS_PER_TABLE as usize || rows > self.capacity {
            let why = format!(
                "its table ({} rows, {} MiB) is larger than {}",
                table.rows.len(),
                table.bytes() >> 20,
                if rows > self.capacity {
                    format!(
                        "the unwind row array ({} MiB; --unwind-table-mib raises it)",
                        self.capacity_bytes() >> 20
                    )
                } else {
                    format!("the walk can search ({MAX_ROWS_PER_TABLE} rows)")
                }
            );
            self.decide(&key, TableState::Unavailable { why });
            return;
        }
        // A table nobody sampled yet takes free room only; a sampled one may evict.
        let Some(first_row) = self.allocate(rows, sampled.then(Instant::now)) else {
            self.decide(&key, TableState::NoRoom { rows });
            return;
        };
        if let Err(e) = self.write_rows(first_row, &table.rows) {
            self.decide(
                &key,
                TableState::Unavailable {
                    why: format!("{e:#}"),
                },
            );
            return;
        }
        log::debug!(
            "unwind table for {}: {rows} rows in {} ms ({} ms of CPU{})",
            self.tables[&key].name,
            took.as_millis(),
            cpu.as_millis(),
            if boosted { ", boosted" } else { "" }
        );
        self.decide(&key, TableState::Resident { first_row, rows });
    }

    /// Writes `rows` into the row array from `first_row` on, through a mapping of just the
    /// pages they cover.
    fn write_rows(&self, first_row: u32, rows: &[UnwindRow]) -> anyhow::Result<()> {
        let size = std::mem::size_of::<UnwindRow>();
        let at = first_row as usize * size;
        let bytes = std::mem::size_of_val(rows);
        let page = rustix::param::page_size();
        let window = at & !(page - 1);
        // SAFETY: the map was created with BPF_F_MMAPABLE and holds `capacity` rows, which
        // cover the window (`allocate` keeps tables inside it); the kernel program only reads.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(window as u64)
                .len(at + bytes - window)
                .map_mut(self.rows_map.fd().as_fd_raw())
        }
        .context("mapping the unwind row array")?;
        // SAFETY: UnwindRow is plain #[repr(C)] data without padding.
        let src = unsafe { std::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), bytes) };
        map[at - window..].copy_from_slice(src);
        Ok(())
    }

    /// Sets `key`'s state, tells the kernel, and warns once about an object left without a
    /// table for a reason the user can act on.
    fn decide(&mut self, key: &FileKey, state: TableState) {
        let capacity_mib = self.capacity_bytes() >> 20;
        let Some(table) = self.tables.get_mut(key) else {
            return;
        };
        let warning = match &state {
            TableState::Unavailable { why }
                if why.contains("larger than") || why.starts_with(super::table::BUILD_LIMIT) =>
            {
                Some(why.clone())
            }
            TableState::NoRoom { rows } if table.last_sampled.is_some() => Some(format!(
                "the unwind row array ({capacity_mib} MiB) is full of tables sampled in the \
                 last {}s; its table needs {} MiB (--unwind-table-mib raises the array)",
                RECENTLY_SAMPLED.as_secs(),
                (u64::from(*rows) * 8) >> 20
            )),
            TableState::Unavailable { why } => {
                log::debug!("no unwind table for {}: {why}", table.name);
                None
            }
            _ => None,
        };
        if let Some(why) = warning {
            if !table.warned {
                table.warned = true;
                log::warn!("{} unwinds by frame pointer: {why}", table.name);
            }
        }
        if matches!(state, TableState::Resident { .. }) {
            table.resident_since = Some(Instant::now());
        } else if matches!(table.state, TableState::Resident { .. }) {
            table.sampled_untabled = None;
        }
        table.state = state;
        self.write_processes_of(key);
    }

    /// The resident tables: (first row, rows).
    fn resident(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.tables.values().filter_map(|t| match t.state {
            TableState::Resident { first_row, rows } => Some((first_row, rows)),
            _ => None,
        })
    }

    /// The first free range of `rows` rows, evicting tables sampled before `evict_before`
    /// (never-sampled ones first, then the longest unsampled) when `Some` and nothing is free.
    fn allocate(&mut self, rows: u32, sampled_at: Option<Instant>) -> Option<u32> {
        loop {
            if let Some(at) = self.free_range(rows) {
                return Some(at);
            }
            let now = sampled_at?;
            let victim = self
                .tables
                .iter()
                .filter(|(_, t)| matches!(t.state, TableState::Resident { .. }))
                .filter(|(_, t)| evictable(t, now))
                .min_by_key(|(_, t)| t.last_sampled)
                .map(|(k, _)| k.clone())?;
            let TableState::Resident {
                rows: victim_rows, ..
            } = self.tables[&victim].state
            else {
                return None;
            };
            log::info!(
                "evicting the unwind table of {} ({victim_rows} rows) for a sampled object",
                self.tables[&victim].name
            );
            // The kernel forgets the rows before they are reused.
            self.decide(&victim, TableState::Evicted { rows: victim_rows });
            self.evictions += 1;
        }
    }

    /// Whether `rows` rows fit now, or would once unsampled tables are evicted.
    fn can_make_room(&self, rows: u32, now: Instant) -> bool {
        if self.free_range(rows).is_some() {
            return true;
        }
        let evictable: u64 = self
            .tables
            .values()
            .filter(|t| evictable(t, now))
            .filter_map(|t| match t.state {
                TableState::Resident { rows, .. } => Some(u64::from(rows)),
                _ => None,
            })
            .sum();
        let used: u64 = self.resident().map(|(_, r)| u64::from(r)).sum();
        u64::from(self.capacity) - used + evictable >= u64::from(rows)
    }

    /// The first gap of `rows` free rows in the array.
    fn free_range(&self, rows: u32) -> Option<u32> {
        let mut taken: Vec<(u32, u32)> = self.resident().collect();
        taken.sort_unstable();
        let mut at = 0u32;
        for (first, len) in taken {
            if first.saturating_sub(at) >= rows {
                return Some(at);
            }
            at = at.max(first + len);
        }
        (self.capacity.saturating_sub(at) >= rows).then_some(at)
    }
}

/// Whether a resident table may be evicted for one sampled at `now`: it was not sampled in the
/// last [`RECENTLY_SAMPLED`].
fn evictable(table: &Table, now: Instant) -> bool {
    table
        .last_sampled
        .is_none_or(|t| now.saturating_duration_since(t) >= RECENTLY_SAMPLED)
}

/// Whether `pid` still runs bpfprof's own image: a launched command between fork and exec.
/// Its tables are loaded after the exec; building bpfprof's own would only delay the command.
pub(crate) fn is_unexeced_child(pid: u32) -> bool {
    let id = |path: String| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    pid != std::process::id()
        && id(format!("/proc/{pid}/exe"))
            .is_some_and(|child| id("/proc/self/exe".into()) == Some(child))
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
