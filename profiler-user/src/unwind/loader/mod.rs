//! Fills the kernel program's CFI maps for a target: its executable mappings, each pointing at
//! the unwind table of the object it maps, built once per file and shared by every process
//! and run that maps it.
//!
//! [`UnwindMaps`] is the one type, its methods split by concern: here its state, the calls a
//! run makes (track a process, settle, poll, unload) and what it reports; in `mappings` a
//! process's executable mappings given to the kernel; in `tables` each table's life (queued,
//! built, installed, decided); in `rows` the room in the kernel's row array (allocation and
//! eviction).

mod jit;
mod mappings;
mod rows;
mod tables;

pub(crate) use mappings::is_unexeced_child;

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

pub use super::file_key::FileKey;
use super::{
    builder::{BuildPriority, Builder, Built, Image, Job, Owner},
    cache::TableCache,
    table::{load_bias, UnwindTable},
    UnwindMode,
};

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
    /// The JIT code tables runtimes gave ([`UnwindMaps::set_jit_table`]), by host pid.
    jit: jit::JitTables,
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
            jit: Default::default(),
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

    /// Stops walking `pid` by CFI; its tables stay resident for other processes and runs.
    pub fn unload_process(&mut self, pid: u32) {
        if self.tracked.remove(&pid).is_some() {
            let _ = self.processes.remove(&pid);
        }
        self.forget_jit_table(pid);
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
}
