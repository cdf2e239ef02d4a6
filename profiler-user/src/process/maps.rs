//! What symbolization needs from a live process, captured while it lives: its executable
//! memory mappings and an open handle on each mapped file. With these, stacks of a process
//! that has exited (or lives in another mount namespace) still resolve.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use procfs::process::{MMPermissions, MMapPath, MemoryMap, Process};

use crate::error::{Error, Result};

/// A file's identity as the daemon verified it when it opened the file (`fstat` of the open
/// descriptor): device and inode, and the size, modification time and owner, so that a file
/// overwritten in place (same inode) is another file to every cache keyed by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Device number (`st_dev`).
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Owner's user id.
    pub uid: u32,
}

impl FileId {
    /// The identity of an open file from its `fstat`.
    pub fn of(stat: &rustix::fs::Stat) -> FileId {
        FileId {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mtime_ns: i128::from(stat.st_mtime) * 1_000_000_000 + i128::from(stat.st_mtime_nsec),
            uid: stat.st_uid,
        }
    }
}

/// A file mapped into a target, kept open so it can be read after the target is gone.
#[derive(Debug)]
pub struct MappedFile {
    /// The path as the target sees it (inside its mount namespace).
    pub path: PathBuf,
    /// The file's identity.
    pub id: FileId,
    /// Open handle (opened as [`crate::process::target_file::open_mapped`] does).
    pub file: File,
    /// What `fstat` said of it when opened.
    stat: rustix::fs::Stat,
    /// The GNU build id, read on first use.
    build_id: std::sync::OnceLock<Option<String>>,
    /// A descriptor that readers may `mmap`, made on first use (see
    /// [`crate::process::target_file::stable`]); `None` when none could be made.
    stable: std::sync::OnceLock<Option<File>>,
}

impl MappedFile {
    /// A path through which this process can open (and `mmap`, as blazesym does) the file,
    /// whatever the target's namespaces; `None` when the file is one its user could truncate
    /// and too large to copy (see [`crate::process::target_file::stable`]).
    pub fn open_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        let stable = self.stable.get_or_init(|| {
            crate::process::target_file::stable(&self.file, &self.stat)
                .map_err(|e| log::warn!("{} is not symbolized: {e}", self.path.display()))
                .ok()
        });
        Some(PathBuf::from(format!(
            "/proc/self/fd/{}",
            stable.as_ref()?.as_raw_fd()
        )))
    }

    /// The file's GNU build id in hex, if it has one (pprof mappings carry it so that
    /// symbols can be found again later); read by `pread`, not mapped.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id
            .get_or_init(|| {
                use object::Object;
                let reader =
                    crate::process::target_file::ElfReader::new(self.file.try_clone().ok()?);
                let elf = object::File::parse(&reader).ok()?;
                let id = elf.build_id().ok()??;
                Some(id.iter().map(|b| format!("{b:02x}")).collect())
            })
            .as_deref()
    }

    /// The file's name without directories, as shown in `module+0xOFFSET` frames.
    pub fn module_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.to_string_lossy().into_owned())
    }
}

/// The name `/proc/PID/maps` gives the vDSO's mapping, kept as its module name.
pub const VDSO: &str = "[vdso]";

/// One executable mapping.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    backing: Backing,
}

#[derive(Clone, Debug)]
enum Backing {
    File(Arc<MappedFile>),
    /// Anonymous or special memory (`[vdso]`, `[anon]`, a deleted file that could not be opened).
    Named(String),
}

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
    /// Newest capture first: addresses are looked up in the most recent layout that has them.
    generations: Vec<Vec<Mapping>>,
    /// The files opened, by the device and inode the maps name.
    files: HashMap<(u64, u64), Arc<MappedFile>>,
    /// Thread names by tid, kept after threads exit.
    threads: HashMap<u32, String>,
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
    /// The executable mappings of the last read of `/proc/PID/maps`, as procfs parsed them,
    /// so the unwinder's tables are refreshed from the same read (see [`Self::last_read`]).
    last_read: Vec<MemoryMap>,
    /// The vDSO's exported functions, read from its image on first sight (it has no file).
    vdso: Option<crate::process::vdso::VdsoSymbols>,
}

/// A symbol a JIT compiler announced in its perf map.
#[derive(Clone, Debug, PartialEq, Eq)]
struct JitSymbol {
    start: u64,
    end: u64,
    name: String,
}

impl ProcessMaps {
    /// Captures the mappings of `pid` as they are now; `ns_pid` is its pid inside its own pid
    /// namespace, which names its JIT perf map.
    pub fn capture(pid: u32, ns_pid: u32) -> Result<ProcessMaps> {
        let mut maps = ProcessMaps::empty(pid, ns_pid, String::new());
        maps.refresh()?;
        Ok(maps)
    }

    /// Maps of a process that exited before they could be read: every address is unknown.
    pub fn gone(ns_pid: u32) -> ProcessMaps {
        ProcessMaps::empty(0, ns_pid, "[exited child]".into())
    }

    fn empty(pid: u32, ns_pid: u32, comm: String) -> ProcessMaps {
        ProcessMaps {
            pid,
            comm,
            generations: Vec::new(),
            files: HashMap::new(),
            threads: HashMap::new(),
            ns_pid,
            jit: Vec::new(),
            jit_stamp: None,
            jit_cut: false,
            exe: None,
            last_read: Vec::new(),
            vdso: None,
        }
    }

    /// The executable mappings as the last successful read of `/proc/PID/maps` listed them
    /// (empty before the first): what [`crate::unwind::UnwindMaps::track_maps`] takes, so one
    /// parse per refresh serves both symbolization and unwinding.
    pub fn last_read(&self) -> &[MemoryMap] {
        &self.last_read
    }

    /// The process name at the last capture.
    pub fn comm(&self) -> &str {
        &self.comm
    }

    /// The name of thread `tid` (a tid in bpfprof's pid namespace), as last seen.
    pub fn thread_name(&self, tid: u32) -> Option<&str> {
        self.threads.get(&tid).map(String::as_str)
    }

    /// Re-reads the mappings, keeping earlier layouts for addresses sampled before a change.
    pub fn refresh(&mut self) -> Result<()> {
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
        let maps = process.maps().map_err(|_| gone())?;
        let mut mappings = Vec::new();
        let mut read = Vec::new();
        for map in maps {
            if !map.perms.contains(MMPermissions::EXECUTE) {
                continue;
            }
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
                                    stable: std::sync::OnceLock::new(),
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
                backing,
            });
        }
        self.refresh_jit(owner);
        // A zombie has no mappings left: keep what was captured while it lived.
        if mappings.is_empty() {
            return Ok(());
        }
        self.last_read = read;
        if self.generations.first().map(|g| same_layout(g, &mappings)) != Some(true) {
            self.generations.insert(0, mappings);
        }
        self.comm = comm;
        Ok(())
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
        self.generations.iter().any(|g| !g.is_empty())
    }

    /// The executable mapping holding `addr`, as the process saw it, for profiles that keep
    /// real addresses (pprof's mappings).
    pub fn mapping_at(&self, addr: u64) -> Option<MappingInfo> {
        self.generations.iter().find_map(|generation| {
            let m = generation
                .iter()
                .find(|m| m.start <= addr && addr < m.end)?;
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
                offset: m.offset,
                path,
                build_id,
                executable,
            })
        })
    }

    /// Finds what backs `addr`.
    pub fn locate(&self, addr: u64) -> Location {
        for generation in &self.generations {
            if let Some(m) = generation.iter().find(|m| m.start <= addr && addr < m.end) {
                let offset = addr - m.start + m.offset;
                return match &m.backing {
                    Backing::File(f) => Location::File(f.clone(), offset),
                    Backing::Named(name) => Location::Named(name.clone(), addr - m.start),
                };
            }
        }
        Location::Unmapped
    }
}

/// Parses the perf map format JITs write (`START SIZE NAME`, hex numbers, one symbol a line;
/// see linux `tools/perf/Documentation/jit-interface.txt`). Malformed lines are skipped.
fn parse_perf_map(text: &str) -> Vec<JitSymbol> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut symbols: Vec<JitSymbol> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.trim().splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            let name = parts.next()?.trim();
            (!name.is_empty() && size > 0).then(|| JitSymbol {
                start,
                end: start.saturating_add(size),
                name: name.to_string(),
            })
        })
        .collect();
    symbols.sort_by_key(|s| s.start);
    symbols
}

fn same_layout(a: &[Mapping], b: &[Mapping]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.start == y.start && x.end == y.end && x.offset == y.offset)
}

/// Opens a mapped file as [`crate::process::target_file::open_mapped`] does (through `map_files`,
/// else its path in the target's root if that is still the mapped file).
fn open_mapped(
    pid: u32,
    start: u64,
    end: u64,
    path: &Path,
    dev_ino: (u64, u64),
) -> Option<(File, rustix::fs::Stat)> {
    crate::process::target_file::open_mapped(pid, (start, end), path, dev_ino)
        .map_err(|e| log::debug!("cannot open {} of pid {pid}: {e}", path.display()))
        .ok()
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
        let mut maps = ProcessMaps::capture(std::process::id(), std::process::id()).unwrap();
        maps.jit = symbols;
        assert_eq!(maps.jit_symbol(0x7f0000001010), Some("jitted_add"));
        assert_eq!(
            maps.jit_symbol(0x7f00000000ff),
            Some("LazyCompile:*foo app.js:3")
        );
        assert_eq!(maps.jit_symbol(0x7f0000001040), None);
        assert_eq!(maps.jit_symbol(0x10), None);
    }

    #[test]
    fn locates_own_code_in_own_binary() {
        let maps = ProcessMaps::capture(std::process::id(), std::process::id()).unwrap();
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
}
