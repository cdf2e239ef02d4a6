//! Finds a process's CPython: the mapped object that defines `_PyRuntime` (a `libpython3.X.so`
//! or a statically linked `python3.X`), where that symbol is in the process, and the version.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::Mutex,
};

use anyhow::{anyhow, Context};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use procfs::process::MMapPath;

use super::memory::ProcessMemory;
use crate::{process::maps::FileId, Error, Result};

/// The interpreter found in a process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// The object's path as the process sees it (its mount namespace).
    pub path: PathBuf,
    /// `(major, minor)`.
    pub version: (u8, u8),
    /// `Py_Version` (`PY_VERSION_HEX`, 0xMMmmPPRS) where the object defines it (3.11 and
    /// later).
    pub version_hex: Option<u32>,
    /// Runtime address of `_PyRuntime`.
    pub runtime: u64,
}

/// Why a process has no interpreter bpfprof can read; `Ok(Err(reason))` of [`find`].
pub type NotPython = String;

/// One file's mapping: start and end address, file offset.
type Mapping = (u64, u64, u64);
/// Each mapped file's device and inode (as the maps name them), and its mappings.
type FileMappings = BTreeMap<PathBuf, ((u64, u64), Vec<Mapping>)>;

/// Most objects a [`DetectMemo`] keeps: past it, it starts again empty (a machine runs a
/// handful of interpreters; builds start thousands of other objects, which never get here).
const MEMO_OBJECTS: usize = 256;

/// What an object named like CPython defines, by the object's identity ([`FileId`]: device,
/// inode, size, modification time and owner, from `fstat` of the open file), so that the
/// hundredth process of one interpreter is not searched for `_PyRuntime` again: on a host of
/// 150 CPython services, searching each one's symbol tables was a tenth of the agent's CPU
/// while it took them in. A file changed in place is another identity, and searched anew.
#[derive(Default)]
pub struct DetectMemo(Mutex<HashMap<FileId, Option<Symbols>>>);

/// The link-time addresses [`runtime_of`] looks for in an object, and its loadable
/// segments' (page-aligned file offset, page-aligned address), from which a process's
/// mappings give the load bias.
#[derive(Clone, Debug)]
pub struct Symbols {
    runtime: u64,
    py_version: Option<u64>,
    segments: Vec<(u64, u64)>,
}

impl DetectMemo {
    fn get(&self, id: &FileId) -> Option<Option<Symbols>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn put(&self, id: FileId, symbols: Option<Symbols>) {
        let mut memo = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if memo.len() >= MEMO_OBJECTS {
            memo.clear();
        }
        memo.insert(id, symbols);
    }

    /// How many objects it holds (for tests).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a mapped object's file name is one CPython's build gives (`libpython3.X.so*`,
/// `python3.X`): only those are opened.
fn named_like_python(path: &std::path::Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libpython") || n.starts_with("python"))
}

/// Finds the CPython of process `pid`, of any version (whether bpfprof can walk it is the
/// layout's question); `Ok(Err(reason))` when it runs none. `mapped` is the process's
/// executable mappings as its caller just read them (empty when it has none): when none is
/// named like CPython the process runs none (its interpreter's code is mapped executable),
/// and its maps are not read again. Objects already searched are found in `memo`.
pub fn find(
    pid: u32,
    memory: &ProcessMemory,
    mapped: &[procfs::process::MemoryMap],
    memo: &DetectMemo,
) -> Result<Result<Interpreter, NotPython>> {
    if !mapped.is_empty()
        && !mapped.iter().any(|m| match &m.pathname {
            MMapPath::Path(path) => named_like_python(path),
            _ => false,
        })
    {
        return Ok(Err("no libpython or python binary mapped".into()));
    }
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(Error::NoSuchProcess(format!("pid {pid} does not exist")));
    }
    // Only the lines of objects named like CPython are parsed: a process may map tens of
    // thousands of things (a hostile one mapped 60,000), and this runs on every tick while it
    // is young.
    let text = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(Error::PermissionDenied(format!(
                "reading /proc/{pid}/maps (a CPython's frames are read from its memory)"
            )))
        }
        Err(e) => {
            return Err(anyhow::Error::from(e)
                .context(format!("read /proc/{pid}/maps"))
                .into())
        }
    };
    let line_like_python = |line: &&str| {
        line.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with("libpython") || name.starts_with("python"))
    };
    let wanted: String = text
        .lines()
        .filter(line_like_python)
        .flat_map(|l| [l, "\n"])
        .collect();
    let maps =
        <procfs::process::MemoryMaps as procfs::FromBufRead>::from_buf_read(wanted.as_bytes())
            .with_context(|| format!("parse /proc/{pid}/maps"))?;
    let files = by_file(maps);
    // Only objects named like CPython are opened: `libpython3.X.so*` and `python3.X` (the
    // names CPython's build gives them); anything else mapped is left alone.
    let candidates: Vec<_> = files
        .iter()
        .filter(|(path, _)| named_like_python(path))
        .collect();
    if candidates.is_empty() {
        return Ok(Err("no libpython or python binary mapped".into()));
    }
    let mut reasons = Vec::new();
    for (path, (dev_ino, mappings)) in candidates {
        match runtime_of(pid, path, *dev_ino, mappings, memo)? {
            Some((runtime, py_version)) => {
                let hex = match py_version {
                    // `Py_Version` is `PY_VERSION_HEX`: 0xMMmmPPRS.
                    Some(addr) => Some(memory.read_u32(addr)?),
                    None => None,
                };
                let version = match hex {
                    Some(hex) => ((hex >> 24) as u8, (hex >> 16) as u8),
                    None => match version_from_name(path) {
                        Some(v) => v,
                        None => {
                            reasons.push(format!(
                                "{}: defines _PyRuntime but neither Py_Version nor a versioned name",
                                path.display()
                            ));
                            continue;
                        }
                    },
                };
                return Ok(Ok(Interpreter {
                    path: path.clone(),
                    version,
                    version_hex: hex,
                    runtime,
                }));
            }
            None => reasons.push(format!("{}: no _PyRuntime", path.display())),
        }
    }
    Ok(Err(reasons.join("; ")))
}

/// `maps`' file mappings grouped by file: its device and inode, and each mapping's (start,
/// end, file offset).
fn by_file(maps: procfs::process::MemoryMaps) -> FileMappings {
    let mut files: FileMappings = BTreeMap::new();
    for m in maps {
        if let MMapPath::Path(path) = m.pathname {
            let dev_ino = (libc::makedev(m.dev.0 as u32, m.dev.1 as u32), m.inode);
            files
                .entry(path)
                .or_insert_with(|| (dev_ino, Vec::new()))
                .1
                .push((m.address.0, m.address.1, m.offset));
        }
    }
    files
}

/// The runtime address of ELF section `section` in the first object mapped by process `pid`
/// whose file name `wanted` accepts and that has that section (CPython 3.14's
/// `.AsyncioDebug`, in the `_asyncio` extension or, where it is built in, the interpreter):
/// `None` when no such object is mapped. Only the maps lines of accepted names are parsed,
/// and the objects are opened as [`find`] opens them.
pub fn section_address(
    pid: u32,
    wanted: &dyn Fn(&str) -> bool,
    section: &str,
) -> Result<Option<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("read /proc/{pid}/maps"))?;
    let named = |line: &&str| line.rsplit('/').next().is_some_and(wanted);
    let lines: String = text.lines().filter(named).flat_map(|l| [l, "\n"]).collect();
    let maps =
        <procfs::process::MemoryMaps as procfs::FromBufRead>::from_buf_read(lines.as_bytes())
            .with_context(|| format!("parse /proc/{pid}/maps"))?;
    let files = by_file(maps);
    for (path, (dev_ino, mappings)) in &files {
        let &(start, end, _) = mappings.first().expect("a mapped file has a mapping");
        let Ok((file, _)) =
            crate::process::target_file::open_mapped(pid, (start, end), path, *dev_ino)
        else {
            continue;
        };
        let reader = crate::process::target_file::ElfReader::new(file);
        let Ok(elf) = object::File::parse(&reader) else {
            continue;
        };
        let Some(address) = elf.section_by_name(section).map(|s| s.address()) else {
            continue;
        };
        if let Some(bias) = load_bias(&aligned_segments(&elf), mappings) {
            return Ok(Some(address.wrapping_add(bias)));
        }
    }
    Ok(None)
}

/// `(major, minor)` from a name such as `libpython3.10.so.1.0` or `python3.10`.
fn version_from_name(path: &std::path::Path) -> Option<(u8, u8)> {
    let name = path.file_name()?.to_str()?;
    let rest = name
        .strip_prefix("lib")
        .unwrap_or(name)
        .strip_prefix("python")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Runtime addresses of `_PyRuntime` and, where defined, `Py_Version`, when `path` defines
/// `_PyRuntime`. The target controls the file (and what its path names now: a deleted
/// interpreter's `PATH (deleted)` may be a FIFO), so the mapped object itself is opened through
/// `/proc/PID/map_files` (as [`crate::process::target_file::open_mapped`] does: never blocking, a
/// regular file only) and read by `pread` (a file truncated meanwhile cannot SIGBUS the
/// daemon). What the object defines is kept in `memo` by the open file's identity.
fn runtime_of(
    pid: u32,
    path: &std::path::Path,
    dev_ino: (u64, u64),
    mappings: &[Mapping],
    memo: &DetectMemo,
) -> Result<Option<(u64, Option<u64>)>> {
    let &(start, end, _) = mappings.first().expect("a mapped file has a mapping");
    let (file, stat) = crate::process::target_file::open_mapped(pid, (start, end), path, dev_ino)
        .with_context(|| format!("open {} of pid {pid}", path.display()))?;
    let id = FileId::of(&stat);
    let symbols = match memo.get(&id) {
        Some(symbols) => symbols,
        None => {
            let symbols = symbols_of(file, path)?;
            memo.put(id, symbols.clone());
            symbols
        }
    };
    let Some(symbols) = symbols else {
        return Ok(None);
    };
    let bias = load_bias(&symbols.segments, mappings)
        .ok_or_else(|| anyhow!("{}: no mapping matches a loadable segment", path.display()))?;
    Ok(Some((
        symbols.runtime.wrapping_add(bias),
        symbols.py_version.map(|a| a.wrapping_add(bias)),
    )))
}

/// What object `file` (mapped at `path`) defines of [`Symbols`]; `None` when it does not
/// define `_PyRuntime`.
fn symbols_of(file: std::fs::File, path: &std::path::Path) -> Result<Option<Symbols>> {
    let reader = crate::process::target_file::ElfReader::new(file);
    let elf = object::File::parse(&reader)
        .map_err(|e| reader.explain(e.into()))
        .with_context(|| format!("parse {}", path.display()))?;
    let symbol = |name: &str| {
        // `.dynsym` first: Debian's stripped python3.11 keeps `_PyRuntime` only there.
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|s| s.is_definition() && s.name() == Ok(name))
            .map(|s| s.address())
    };
    let Some(runtime) = symbol("_PyRuntime") else {
        return Ok(None);
    };
    Ok(Some(Symbols {
        runtime,
        py_version: symbol("Py_Version"),
        segments: aligned_segments(&elf),
    }))
}

/// Each loadable segment's (page-aligned file offset, page-aligned address): what
/// [`load_bias`] matches against a process's mappings.
fn aligned_segments<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
) -> Vec<(u64, u64)> {
    const PAGE: u64 = 4096;
    elf.segments()
        .map(|segment| {
            let (file_offset, _) = segment.file_range();
            (file_offset & !(PAGE - 1), segment.address() & !(PAGE - 1))
        })
        .collect()
}

/// The difference between the object's runtime and link-time addresses, from a mapping whose
/// file offset is a loadable segment's (page-aligned) start (`segments` as [`Symbols`] keeps
/// them).
fn load_bias(segments: &[(u64, u64)], mappings: &[Mapping]) -> Option<u64> {
    for &(aligned_offset, aligned_vaddr) in segments {
        if let Some(&(start, _, _)) = mappings.iter().find(|m| m.2 == aligned_offset) {
            return Some(start.wrapping_sub(aligned_vaddr));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{find, version_from_name, DetectMemo};
    use crate::runtime::cpython::memory::ProcessMemory;
    use std::path::Path;

    /// A sleeping Debian python3.11, once its interpreter is mapped.
    fn sleeping_python() -> Option<std::process::Child> {
        let python = "/usr/bin/python3.11";
        if !Path::new(python).exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{python} is needed under CI"
            );
            eprintln!("skipping: {python} not installed");
            return None;
        }
        let mut child = std::process::Command::new(python)
            .args(["-c", "import time; time.sleep(60)"])
            .spawn()
            .expect("start python");
        let maps = format!("/proc/{}/maps", child.id());
        for _ in 0..500 {
            if std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("python3.11")) {
                return Some(child);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = (child.kill(), child.wait());
        panic!("python3.11 never mapped its interpreter");
    }

    /// The second process of one interpreter is found from the memo the first filled, at
    /// its own address (its own load bias), the same as without the memo; a process whose
    /// mappings name no interpreter is not read.
    #[test]
    fn a_second_process_of_an_interpreter_is_found_from_the_memo() {
        let Some(mut a) = sleeping_python() else {
            return;
        };
        let Some(mut b) = sleeping_python() else {
            let _ = (a.kill(), a.wait());
            return;
        };
        let memo = DetectMemo::default();
        let found = |pid: u32, memo: &DetectMemo| {
            find(pid, &ProcessMemory::new(pid), &[], memo)
                .expect("readable")
                .expect("a CPython")
        };
        let first = found(a.id(), &memo);
        assert_eq!(memo.len(), 1, "the interpreter's object is kept");
        let from_memo = found(b.id(), &memo);
        assert_eq!(memo.len(), 1, "and found there for the second process");
        let fresh = found(b.id(), &DetectMemo::default());
        assert_eq!(
            (from_memo.runtime, from_memo.version, from_memo.version_hex),
            (fresh.runtime, fresh.version, fresh.version_hex)
        );
        assert_eq!(first.version, (3, 11));
        let _ = (a.kill(), b.kill(), a.wait(), b.wait());

        // This test binary maps no interpreter: its mappings say so, and nothing is read.
        let own: Vec<_> = procfs::process::Process::myself()
            .and_then(|p| p.maps())
            .expect("own maps")
            .into_iter()
            .filter(|m| m.perms.contains(procfs::process::MMPermissions::EXECUTE))
            .collect();
        let me = std::process::id();
        let said = find(me, &ProcessMemory::new(me), &own, &memo).expect("readable");
        assert!(said.is_err(), "{said:?}");
    }

    #[test]
    fn versions_from_names() {
        assert_eq!(
            version_from_name(Path::new("/x/libpython3.10.so.1.0")),
            Some((3, 10))
        );
        assert_eq!(
            version_from_name(Path::new("/usr/bin/python3.11")),
            Some((3, 11))
        );
        assert_eq!(version_from_name(Path::new("/usr/bin/python")), None);
    }
}
