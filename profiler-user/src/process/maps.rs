//! What symbolization needs from a live process, captured while it lives: its executable
//! memory mappings and an open handle on each mapped file. With these, stacks of a process
//! that has exited (or lives in another mount namespace) still resolve.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use procfs::process::{MMPermissions, MMapPath, MemoryMap, Process};

use crate::{
    error::{Error, Result},
    process::copies::CopyBudget,
};

mod file;
mod layout;
mod perf_map;

use file::open_mapped;
pub use file::{FileId, MappedFile};
use layout::{bounded, find, retire, same_layout, uncover, Backing, Mapping};
pub use perf_map::{parse_perf_map, JitSymbol};

/// The name `/proc/PID/maps` gives the vDSO's mapping, kept as its module name.
pub const VDSO: &str = "[vdso]";

/// Executable mappings one process keeps named at most, in its current layout: a process
/// mapping code 60,000 times made every lookup a linear search over all of them (the
/// symbolizer spent over 10 minutes in one run). Real processes map a few hundred (PyTorch:
/// about 200); past this bound each object's first mappings are kept and the rest counted.
pub const MAX_TRACKED_MAPPINGS: usize = 16384;

/// Mappings of earlier layouts kept at most (for addresses sampled before the process
/// unmapped or moved them): past it, those retired longest ago are dropped and counted.
pub const MAX_RETIRED_MAPPINGS: usize = 16384;

/// Executable mappings past which a refresh gives the memory it freed back to the kernel
/// (`malloc_trim`). Reading 60,000 mappings parses tens of MB that are freed at once, but
/// glibc keeps freed memory in the arena of the thread that freed it, and ticks run on any of
/// the daemon's blocking threads: each arena kept its own copy, and the daemon profiling such
/// a process grew to 190-220 MB of RSS (75-135 MB with the trim; the rest was the arenas'
/// free tops, see the daemon's `MMAP_THRESHOLD`). Real processes map a few hundred, whose
/// refreshes do not pay for the trim.
pub const TRIM_AFTER_MAPPINGS: usize = 4096;

/// An executable mapping of a process: its address range, file offset and file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MappingInfo {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// Full path as the process sees it, or a name like `[vdso]`.
    pub path: String,
    /// The file's GNU build id in hex, where it has one.
    pub build_id: Option<String>,
    /// Whether this is the process's executable (`/proc/PID/exe`), not a library.
    pub executable: bool,
}

/// Where an address falls in a target's memory.
#[derive(Clone, Debug)]
pub enum Location {
    /// In a mapped file, at this file offset.
    File(Arc<MappedFile>, u64),
    /// In memory that no file backs, named like `[vdso]`, at this offset from its mapping.
    Named(String, u64),
    /// Outside every executable mapping seen.
    Unmapped,
}

/// The executable mappings of one process, accumulated over every capture.
#[derive(Debug)]
pub struct ProcessMaps {
    pid: u32,
    comm: String,
    /// The executable mappings of the last capture, sorted by address (they never overlap).
    current: Vec<Mapping>,
    /// What earlier captures had and the last one does not, sorted and non-overlapping, the
    /// newest winning where they overlapped: an address is looked up in `current`, then
    /// here, as in the most recent layout that had it.
    retired: Vec<Mapping>,
    /// Captures that changed the layout so far.
    layouts: u64,
    /// Executable mappings left unnamed at the last capture (over [`MAX_TRACKED_MAPPINGS`]).
    untracked: usize,
    /// Mappings of earlier layouts dropped (over [`MAX_RETIRED_MAPPINGS`]).
    retired_dropped: u64,
    /// The files opened, by the device and inode the maps name.
    files: HashMap<(u64, u64), Arc<MappedFile>>,
    /// Thread names by tid, kept after threads exit.
    threads: HashMap<u32, String>,
    /// Names the program gave its threads where the kernel's are not theirs (Python's
    /// `threading` names), by tid; they win over `threads`.
    given_names: HashMap<u32, String>,
    /// The pid inside the target's own namespace: JIT maps are named after it.
    ns_pid: u32,
    /// JIT symbols from `/tmp/perf-PID.map`, sorted by start address.
    jit: Vec<JitSymbol>,
    /// The perf map's identity when last read, to skip unchanged re-reads.
    jit_stamp: Option<FileId>,
    /// Whether a perf map over [`crate::process::target_file::PERF_MAP_MAX_BYTES`] was cut (warned once).
    jit_cut: bool,
    /// The process's executable as `/proc/PID/exe` names it, as last seen.
    exe: Option<PathBuf>,
    /// Its executable memory in KiB as the last read of its maps lists it (see
    /// [`Self::executable_kib`]).
    executable_kib: Option<u64>,
    /// The executable mappings of the last read of `/proc/PID/maps`, as procfs parsed them,
    /// so the unwinder's tables are refreshed from the same read (see [`Self::last_read`]).
    last_read: Vec<MemoryMap>,
    /// The vDSO's exported functions, read from its image on first sight (it has no file).
    vdso: Option<crate::process::vdso::VdsoSymbols>,
    /// The budget the copies of its files count against (its driver's).
    budget: CopyBudget,
    /// The process's root as last seen (given to the files it maps; see
    /// [`crate::process::target_file::ProcessRoot`]).
    root: Option<Arc<crate::process::target_file::ProcessRoot>>,
}

impl ProcessMaps {
    /// Captures the mappings of `pid` as they are now; `ns_pid` is its pid inside its own pid
    /// namespace, which names its JIT perf map. Copies of its files count against `budget`.
    pub fn capture(pid: u32, ns_pid: u32, budget: &CopyBudget) -> Result<ProcessMaps> {
        let mut maps = ProcessMaps::empty(pid, ns_pid, String::new());
        maps.budget = budget.clone();
        maps.refresh()?;
        Ok(maps)
    }

    /// Maps of a process that exited before they could be read: every address is unknown.
    pub fn gone(ns_pid: u32) -> ProcessMaps {
        ProcessMaps::gone_as(ns_pid, "[exited child]")
    }

    /// Like [`Self::gone`], shown as `name`.
    pub fn gone_as(ns_pid: u32, name: &str) -> ProcessMaps {
        ProcessMaps::empty(0, ns_pid, name.into())
    }

    fn empty(pid: u32, ns_pid: u32, comm: String) -> ProcessMaps {
        ProcessMaps {
            pid,
            comm,
            current: Vec::new(),
            retired: Vec::new(),
            layouts: 0,
            untracked: 0,
            retired_dropped: 0,
            files: HashMap::new(),
            threads: HashMap::new(),
            given_names: HashMap::new(),
            ns_pid,
            jit: Vec::new(),
            jit_stamp: None,
            jit_cut: false,
            exe: None,
            executable_kib: None,
            last_read: Vec::new(),
            vdso: None,
            // Maps that open no file copy nothing.
            budget: CopyBudget::new(0),
            root: None,
        }
    }

    /// The executable mappings as the last successful read of `/proc/PID/maps` listed them
    /// (empty before the first): what [`crate::unwind::UnwindMaps::track_maps`] takes, so one
    /// parse per refresh serves both symbolization and unwinding.
    pub fn last_read(&self) -> &[MemoryMap] {
        &self.last_read
    }

    /// Its executable memory in KiB as the last successful read of its maps lists it: the
    /// kernel's `exec_vm` (`VmExe` + `VmLib` of its status, see
    /// [`crate::process::target::Target::executable_kib`]) counts the mappings that are
    /// executable, not writable and not a stack. `None` before a read.
    pub fn executable_kib(&self) -> Option<u64> {
        self.executable_kib
    }

    /// The process name at the last capture.
    pub fn comm(&self) -> &str {
        &self.comm
    }

    /// The name of thread `tid` (a tid in bpfprof's pid namespace), as last seen: the one the
    /// program gave it ([`Self::name_threads`]), else the kernel's.
    pub fn thread_name(&self, tid: u32) -> Option<&str> {
        self.given_names
            .get(&tid)
            .or_else(|| self.threads.get(&tid))
            .map(String::as_str)
    }

    /// Notes the names the program gave its threads (tids in bpfprof's pid namespace), kept
    /// after the threads exit.
    pub fn name_threads(&mut self, names: HashMap<u32, String>) {
        self.given_names.extend(names);
    }

    /// Re-reads the mappings, keeping earlier layouts for addresses sampled before a change.
    pub fn refresh(&mut self) -> Result<()> {
        let read = self.read_maps();
        if read.as_ref().is_ok_and(|&n| n > TRIM_AFTER_MAPPINGS) {
            // SAFETY: malloc_trim takes no pointer; it only returns free pages to the kernel.
            unsafe { libc::malloc_trim(0) };
        }
        read.map(|_| ())
    }

    /// [`Self::refresh`]'s work, whose parse is freed when it returns: how many executable
    /// mappings the process has.
    fn read_maps(&mut self) -> Result<usize> {
        let gone = || Error::NoSuchProcess(format!("pid {} exited", self.pid));
        let process = Process::new(self.pid as i32).map_err(|_| gone())?;
        let comm = process.stat().map_err(|_| gone())?.comm;
        // The owner of /proc/PID: the process's effective uid (root for an undumpable one).
        let owner = process.uid().map_err(|_| gone())?;
        if let Ok(exe) = process.exe() {
            self.exe = Some(exe);
        }
        if let Ok(tasks) = process.tasks() {
            for task in tasks.flatten() {
                if let Ok(stat) = task.stat() {
                    self.threads.insert(task.tid as u32, stat.comm);
                }
            }
        }
        // Opened again at each read: a launched `chroot DIR program` changes its root after
        // the first one. Kept while it is the same directory.
        match crate::process::target_file::ProcessRoot::of(self.pid) {
            Ok(root) if !self.root.as_ref().is_some_and(|r| r.same_as(&root)) => {
                self.root = Some(Arc::new(root));
            }
            Ok(_) => {}
            Err(e) => log::debug!("pid {}: its root: {e}", self.pid),
        }
        let maps = process.maps().map_err(|_| gone())?;
        let executable: Vec<MemoryMap> = maps
            .into_iter()
            .filter(|m| m.perms.contains(MMPermissions::EXECUTE))
            .collect();
        let listed = executable.len();
        // Counted like the kernel's `exec_vm`: `[vsyscall]` is no mapping of the process's own.
        self.executable_kib = Some(
            executable
                .iter()
                .filter(|m| {
                    !m.perms.contains(MMPermissions::WRITE)
                        && !matches!(m.pathname, MMapPath::Stack | MMapPath::Vsyscall)
                })
                .map(|m| (m.address.1 - m.address.0) >> 10)
                .sum(),
        );
        let (executable, untracked) = bounded(executable);
        let mut mappings = Vec::with_capacity(executable.len());
        let mut read = Vec::with_capacity(executable.len());
        for map in executable {
            read.push(map.clone());
            let (start, end) = map.address;
            let backing = match &map.pathname {
                MMapPath::Path(path) => {
                    let dev_ino = (libc::makedev(map.dev.0 as u32, map.dev.1 as u32), map.inode);
                    match self.files.get(&dev_ino) {
                        Some(file) => Backing::File(file.clone()),
                        None => match open_mapped(self.pid, start, end, path, dev_ino) {
                            Some((file, stat)) => {
                                let file = Arc::new(MappedFile {
                                    path: path.clone(),
                                    id: FileId::of(&stat),
                                    file,
                                    stat,
                                    build_id: std::sync::OnceLock::new(),
                                    stable: std::sync::Mutex::new(None),
                                    unavailable: std::sync::Mutex::new(None),
                                    budget: self.budget.clone(),
                                    root: self.root.clone(),
                                });
                                self.files.insert(dev_ino, file.clone());
                                Backing::File(file)
                            }
                            None => Backing::Named(path.to_string_lossy().into_owned()),
                        },
                    }
                }
                MMapPath::Vdso => {
                    if self.vdso.is_none() {
                        self.vdso = crate::process::vdso::read_image(self.pid, start, end)
                            .map_err(|e| log::debug!("pid {}: {e:#}", self.pid))
                            .ok()
                            .and_then(|image| crate::process::vdso::VdsoSymbols::parse(&image));
                    }
                    Backing::Named(VDSO.into())
                }
                MMapPath::Vsyscall => Backing::Named("[vsyscall]".into()),
                MMapPath::Anonymous => Backing::Named("[anon]".into()),
                other => Backing::Named(format!("{other:?}")),
            };
            mappings.push(Mapping {
                start,
                end,
                offset: map.offset,
                base: start,
                backing,
                seen: 0,
            });
        }
        self.refresh_jit(owner);
        // A zombie keeps its name (a command as short as `true` is one by its first refresh).
        self.comm = comm;
        // A zombie has no mappings left: keep what was captured while it lived.
        if mappings.is_empty() {
            return Ok(listed);
        }
        // Once per executable in the driver's life: a process (or its many copies) crossing
        // the bound at every refresh said it 64 times in 15 s.
        let object = self.exe.as_deref().map_or_else(
            || format!("comm {}", self.comm),
            |exe| exe.to_string_lossy().into_owned(),
        );
        if untracked > 0 && self.budget.first_time(&format!("mappings of {object}")) {
            log::warn!(
                "pid {}: {} executable mappings; the first {MAX_TRACKED_MAPPINGS} (each \
                 object's first ones first) are named, the rest are not",
                self.pid,
                untracked + MAX_TRACKED_MAPPINGS
            );
        }
        self.untracked = untracked;
        self.last_read = read;
        self.install_layout(mappings);
        Ok(listed)
    }

    /// Makes `mappings` the current layout when it changed, retiring the previous one.
    fn install_layout(&mut self, mut mappings: Vec<Mapping>) {
        // /proc lists mappings by address, and they never overlap.
        mappings.sort_by_key(|m| m.start);
        if same_layout(&self.current, &mappings) {
            return;
        }
        self.layouts += 1;
        let mut old = std::mem::replace(&mut self.current, mappings);
        for m in &mut old {
            m.seen = self.layouts;
        }
        retire(&mut self.retired, old);
        uncover(&mut self.retired, &self.current);
        self.bound_retired();
    }

    /// Drops the mappings retired longest ago beyond [`MAX_RETIRED_MAPPINGS`].
    fn bound_retired(&mut self) {
        let over = self.retired.len().saturating_sub(MAX_RETIRED_MAPPINGS);
        if over == 0 {
            return;
        }
        let mut seen: Vec<u64> = self.retired.iter().map(|m| m.seen).collect();
        seen.sort_unstable();
        // Ties at the cut go too: the bound holds.
        let cut = seen[over - 1];
        let before = self.retired.len();
        self.retired.retain(|m| m.seen > cut);
        self.retired_dropped += (before - self.retired.len()) as u64;
    }

    /// The files of this process that could not be read for symbolization, with why (a
    /// file is only tried once a sample needs its names).
    pub fn unavailable(&self) -> Vec<(&Path, String)> {
        let mut out: Vec<(&Path, String)> = self
            .files
            .values()
            .filter_map(|f| Some((f.path.as_path(), f.unavailable()?)))
            .collect();
        out.sort();
        out
    }

    /// What the bounds on tracked mappings left out: executable mappings not named at the
    /// last capture, and mappings of earlier layouts dropped; `None` when nothing was.
    pub fn limits_hit(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.untracked > 0 {
            parts.push(format!(
                "{} of its {} executable mappings were not named (at most \
                 {MAX_TRACKED_MAPPINGS} are)",
                self.untracked,
                self.untracked + MAX_TRACKED_MAPPINGS
            ));
        }
        if self.retired_dropped > 0 {
            parts.push(format!(
                "{} mappings of its earlier layouts were forgotten (at most \
                 {MAX_RETIRED_MAPPINGS} are kept)",
                self.retired_dropped
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// Re-reads the JIT perf map (`perf-PID.map` in the target's own `/tmp`, reached through
    /// its root so that containers work) when it changed. The target controls that path, and
    /// the daemon reads it as root: only a regular file reached without a symlink and owned by
    /// the target's own user (`owner`) is read (so a link or hard link to a file the user
    /// cannot read names nothing: its owner is another), never blocking (a FIFO is refused
    /// without waiting for a writer), and at most [`crate::process::target_file::PERF_MAP_MAX_BYTES`].
    /// The owner check stands in for opening it with the target's credentials, which the
    /// daemon's unit cannot take (it has no CAP_SETUID).
    fn refresh_jit(&mut self, owner: u32) {
        use crate::process::target_file::{open_in_root, read_capped, PERF_MAP_MAX_BYTES};
        let relative = format!("tmp/perf-{}.map", self.ns_pid);
        let Ok((file, stat)) = open_in_root(self.pid, Path::new(&relative)) else {
            return;
        };
        if stat.st_uid != owner {
            log::debug!(
                "pid {}: /tmp/perf-{}.map belongs to uid {}, not the process's {owner}: unread",
                self.pid,
                self.ns_pid,
                stat.st_uid
            );
            return;
        }
        let stamp = FileId::of(&stat);
        if self.jit_stamp == Some(stamp) {
            return;
        }
        let Ok((mut bytes, cut)) = read_capped(&file, PERF_MAP_MAX_BYTES) else {
            return;
        };
        if cut {
            // Only whole lines: the last one may be cut.
            bytes.truncate(bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1));
            if !self.jit_cut {
                log::warn!(
                    "pid {}: its perf map is over {} MiB; the rest is not read",
                    self.pid,
                    PERF_MAP_MAX_BYTES >> 20
                );
                self.jit_cut = true;
            }
        }
        self.jit = parse_perf_map(&String::from_utf8_lossy(&bytes));
        self.jit_stamp = Some(stamp);
    }

    /// The vDSO function at `offset` in the `[vdso]` mapping, if it exports one there.
    pub fn vdso_symbol(&self, offset: u64) -> Option<&str> {
        self.vdso.as_ref()?.name(offset)
    }

    /// The JIT symbol covering `addr`, if the target announced one.
    pub fn jit_symbol(&self, addr: u64) -> Option<&str> {
        let i = self.jit.partition_point(|s| s.start <= addr);
        let sym = self.jit.get(i.checked_sub(1)?)?;
        (addr < sym.end).then_some(sym.name.as_str())
    }

    /// Whether any mapping of the process was read (not so for a process that exited first).
    pub fn is_known(&self) -> bool {
        !self.current.is_empty()
    }

    /// The mapping holding `addr`: in the last capture's layout, else in the most recent
    /// earlier one that had it.
    fn find(&self, addr: u64) -> Option<&Mapping> {
        find(&self.current, addr).or_else(|| find(&self.retired, addr))
    }

    /// Whether some mapping holds `addr` (what [`Self::mapping_at`] says without copying the
    /// mapping's path: asked for every frame of every sample).
    pub fn maps_address(&self, addr: u64) -> bool {
        self.find(addr).is_some()
    }

    /// Whether the last capture's layout holds `addr` (earlier layouts aside): an address
    /// outside it ran in code mapped since, or in a mapping that replaced one of them.
    pub fn covers_now(&self, addr: u64) -> bool {
        find(&self.current, addr).is_some()
    }

    /// The executable mapping holding `addr`, as the process saw it, for profiles that keep
    /// real addresses (pprof's mappings).
    pub fn mapping_at(&self, addr: u64) -> Option<MappingInfo> {
        let m = self.find(addr)?;
        let (path, build_id, executable) = match &m.backing {
            Backing::File(f) => (
                f.path.to_string_lossy().into_owned(),
                f.build_id().map(str::to_string),
                self.exe.as_deref() == Some(f.path.as_path()),
            ),
            Backing::Named(name) => (name.clone(), None, false),
        };
        Some(MappingInfo {
            start: m.start,
            end: m.end,
            offset: m.offset + (m.start - m.base),
            path,
            build_id,
            executable,
        })
    }

    /// Finds what backs `addr`.
    pub fn locate(&self, addr: u64) -> Location {
        match self.find(addr) {
            Some(m) => match &m.backing {
                Backing::File(f) => Location::File(f.clone(), addr - m.base + m.offset),
                Backing::Named(name) => Location::Named(name.clone(), addr - m.base),
            },
            None => Location::Unmapped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_maps_and_finds_jit_symbols() {
        let text =
            "7f0000001000 40 jitted_add\nbad line\n7f0000000000 0x100 LazyCompile:*foo app.js:3\n";
        let symbols = parse_perf_map(text);
        assert_eq!(symbols.len(), 2);
        assert_eq!(symbols[0].name, "LazyCompile:*foo app.js:3");
        let mut maps =
            ProcessMaps::capture(std::process::id(), std::process::id(), &CopyBudget::new(0))
                .unwrap();
        maps.jit = symbols;
        assert_eq!(maps.jit_symbol(0x7f0000001010), Some("jitted_add"));
        assert_eq!(
            maps.jit_symbol(0x7f00000000ff),
            Some("LazyCompile:*foo app.js:3")
        );
        assert_eq!(maps.jit_symbol(0x7f0000001040), None);
        assert_eq!(maps.jit_symbol(0x10), None);
    }

    fn named(start: u64, end: u64, name: &str) -> Mapping {
        Mapping {
            start,
            end,
            offset: 0,
            base: start,
            backing: Backing::Named(name.into()),
            seen: 0,
        }
    }

    fn name_at(maps: &ProcessMaps, addr: u64) -> Option<(String, u64)> {
        match maps.locate(addr) {
            Location::Named(name, offset) => Some((name, offset)),
            _ => None,
        }
    }

    #[test]
    fn addresses_resolve_in_the_newest_layout_that_had_them() {
        let mut maps = ProcessMaps::gone(1);
        maps.install_layout(vec![named(0x1000, 0x5000, "a"), named(0x8000, 0x9000, "b")]);
        // "c" covers the middle of "a"; "b" is unmapped.
        maps.install_layout(vec![named(0x2000, 0x3000, "c")]);
        assert_eq!(name_at(&maps, 0x2800), Some(("c".into(), 0x800)));
        assert_eq!(name_at(&maps, 0x1800), Some(("a".into(), 0x800)));
        // Offsets stay counted from where "a" began, on both sides of "c".
        assert_eq!(name_at(&maps, 0x4000), Some(("a".into(), 0x3000)));
        assert_eq!(name_at(&maps, 0x8800), Some(("b".into(), 0x800)));
        assert_eq!(
            maps.mapping_at(0x4000).map(|m| (m.start, m.end, m.offset)),
            Some((0x3000, 0x5000, 0x2000))
        );
        // "c" goes: its addresses are found in it still, newer than "a".
        maps.install_layout(vec![named(0x8000, 0x9000, "d")]);
        assert_eq!(name_at(&maps, 0x2800), Some(("c".into(), 0x800)));
        assert_eq!(name_at(&maps, 0x1800), Some(("a".into(), 0x800)));
        assert_eq!(name_at(&maps, 0x8800), Some(("d".into(), 0x800)));
        assert_eq!(name_at(&maps, 0x6000), None);
        // Nothing overlaps in what is kept, so binary search finds every piece.
        assert!(maps.retired.windows(2).all(|w| w[0].end <= w[1].start));
        assert!(maps.limits_hit().is_none());
    }

    #[test]
    fn layouts_kept_are_bounded_and_the_oldest_go_first() {
        let mut maps = ProcessMaps::gone(1);
        // A process that maps its code somewhere new at every capture.
        let captures = MAX_RETIRED_MAPPINGS as u64 + 100;
        for i in 0..captures {
            let at = 0x10_0000 + i * 0x1000;
            maps.install_layout(vec![named(at, at + 0x1000, "jit")]);
        }
        assert!(maps.retired.len() <= MAX_RETIRED_MAPPINGS);
        let last = 0x10_0000 + (captures - 2) * 0x1000;
        assert!(name_at(&maps, last).is_some(), "the newest are kept");
        assert!(name_at(&maps, 0x10_0000).is_none(), "the oldest went");
        let said = maps.limits_hit().expect("the drop is counted");
        assert!(said.contains("earlier layouts were forgotten"), "{said}");
    }

    #[test]
    fn mappings_past_the_bound_keep_each_objects_first_ones() {
        let line = |i: u64, inode: u64, path: &str| {
            let start = 0x1000_0000 + i * 0x2000;
            format!(
                "{start:x}-{:x} r-xp 00000000 08:01 {inode} {path}",
                start + 0x1000
            )
        };
        let mut lines: Vec<String> = (0..MAX_TRACKED_MAPPINGS as u64 + 10)
            .map(|i| line(i, 7, "/tmp/attacker.so"))
            .collect();
        lines.push(line(
            MAX_TRACKED_MAPPINGS as u64 + 20,
            8,
            "/usr/lib/libc.so.6",
        ));
        let text = lines.join("\n") + "\n";
        let maps =
            <procfs::process::MemoryMaps as procfs::FromBufRead>::from_buf_read(text.as_bytes())
                .expect("maps lines")
                .0;
        let (kept, left_out) = bounded(maps);
        assert_eq!(kept.len(), MAX_TRACKED_MAPPINGS);
        assert_eq!(left_out, 11);
        assert!(kept.iter().any(|m| m.inode == 8), "libc is kept");
        assert!(kept.windows(2).all(|w| w[0].address.0 < w[1].address.0));
    }

    #[test]
    fn perf_map_ranges_past_the_address_space_are_skipped() {
        let text = "ffffffffffffffff ffffffffffffffff wrap\nffffffffffffffe0 10 last\n";
        let symbols = parse_perf_map(text);
        assert_eq!(symbols.len(), 1, "{symbols:?}");
        assert_eq!(
            (symbols[0].start, symbols[0].end),
            (u64::MAX - 31, u64::MAX - 15)
        );
    }

    #[test]
    fn locates_own_code_in_own_binary() {
        let maps =
            ProcessMaps::capture(std::process::id(), std::process::id(), &CopyBudget::new(0))
                .unwrap();
        let addr = locates_own_code_in_own_binary as *const () as u64;
        match maps.locate(addr) {
            Location::File(file, offset) => {
                let exe = std::fs::read_link("/proc/self/exe").unwrap();
                assert_eq!(file.path, exe);
                assert!(offset > 0);
                assert!(file.open_path().unwrap().exists());
                let id = file.build_id().expect("test binaries have a GNU build id");
                assert!(
                    id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
                    "{id}"
                );
            }
            other => panic!("expected a file location, got {other:?}"),
        }
        assert!(matches!(maps.locate(8), Location::Unmapped));

        // The mapping as pprof needs it: the range holding the address, the full path.
        let mapping = maps.mapping_at(addr).expect("own code is mapped");
        assert!(mapping.start <= addr && addr < mapping.end);
        assert_eq!(
            Path::new(&mapping.path),
            std::fs::read_link("/proc/self/exe").unwrap()
        );
        assert!(mapping.executable);
        let libc = maps
            .mapping_at(libc::getpid as *const () as u64)
            .expect("libc is mapped");
        assert!(!libc.executable, "{libc:?}");
        assert!(maps.mapping_at(8).is_none());
    }

    /// The executable memory counted from a process's maps is what its status says
    /// (`VmExe` + `VmLib`), before and after it maps more code: a young target's sign of new
    /// code is taken from the maps read at its re-read, and compared with its status later.
    #[test]
    fn executable_memory_from_the_maps_is_the_status_figure() {
        let pid = std::process::id();
        let from_status = || {
            crate::process::target::Target::from_pid(pid)
                .unwrap()
                .executable_kib()
                .unwrap()
        };
        // The maps' figure and the status's, read while no other test thread of this process
        // mapped or unmapped code (the status read the same before and after the maps).
        let both = || {
            for _ in 0..5 {
                let before = from_status();
                let maps = ProcessMaps::capture(pid, pid, &CopyBudget::new(0)).unwrap();
                if from_status() == before {
                    return (maps.executable_kib(), before);
                }
            }
            panic!("this process's code kept changing");
        };
        let (maps, status) = both();
        assert_eq!(maps, Some(status));
        // 64 KiB more of code: an executable mapping of a file.
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .read(true)
            .open(dir.path().join("code"))
            .unwrap();
        file.set_len(64 << 10).unwrap();
        // SAFETY: a new private mapping of a file this test owns, unmapped below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                64 << 10,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let (maps, status) = both();
        // SAFETY: the mapping made above, used by nothing.
        unsafe { libc::munmap(at, 64 << 10) };
        assert_eq!(maps, Some(status));
        assert!(maps >= Some(64), "{maps:?}");
    }
}
