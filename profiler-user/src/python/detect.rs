//! Finds a process's CPython: the mapped object that defines `_PyRuntime` (a `libpython3.X.so`
//! or a statically linked `python3.X`), where that symbol is in the process, and the version.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{anyhow, Context};
use object::{Object, ObjectSegment, ObjectSymbol};
use procfs::process::MMapPath;

use super::memory::ProcessMemory;
use crate::{Error, Result};

/// The interpreter found in a process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// The object's path as the process sees it (its mount namespace).
    pub path: PathBuf,
    /// `(major, minor)`.
    pub version: (u8, u8),
    /// Runtime address of `_PyRuntime`.
    pub runtime: u64,
}

/// Why a process has no interpreter bpfprof can read; `Ok(Err(reason))` of [`find`].
pub type NotPython = String;

/// One file's mapping: start and end address, file offset.
type Mapping = (u64, u64, u64);
/// Each mapped file's mappings.
type FileMappings = BTreeMap<PathBuf, Vec<Mapping>>;

/// Versions whose layouts bpfprof knows.
pub const SUPPORTED: &[(u8, u8)] = &[(3, 10), (3, 11), (3, 12), (3, 13)];

/// Finds the CPython of process `pid`; `Ok(Err(reason))` when it runs none bpfprof supports.
pub fn find(pid: u32, memory: &ProcessMemory) -> Result<Result<Interpreter, NotPython>> {
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
    let named_like_python = |line: &&str| {
        line.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with("libpython") || name.starts_with("python"))
    };
    let wanted: String = text
        .lines()
        .filter(named_like_python)
        .flat_map(|l| [l, "\n"])
        .collect();
    let maps =
        <procfs::process::MemoryMaps as procfs::FromBufRead>::from_buf_read(wanted.as_bytes())
            .with_context(|| format!("parse /proc/{pid}/maps"))?;
    let mut files: FileMappings = BTreeMap::new();
    for m in maps {
        if let MMapPath::Path(path) = m.pathname {
            files
                .entry(path)
                .or_default()
                .push((m.address.0, m.address.1, m.offset));
        }
    }
    // Only objects named like CPython are opened: `libpython3.X.so*` and `python3.X` (the
    // names CPython's build gives them); anything else mapped is left alone.
    let candidates: Vec<_> = files
        .iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libpython") || n.starts_with("python"))
        })
        .collect();
    if candidates.is_empty() {
        return Ok(Err("no libpython or python binary mapped".into()));
    }
    let mut reasons = Vec::new();
    for (path, mappings) in candidates {
        match runtime_of(pid, path, mappings)? {
            Some((runtime, py_version)) => {
                let version = match py_version {
                    Some(addr) => {
                        // `Py_Version` is `PY_VERSION_HEX`: 0xMMmmPPRS.
                        let hex = memory.read_u32(addr)?;
                        ((hex >> 24) as u8, (hex >> 16) as u8)
                    }
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
                if !SUPPORTED.contains(&version) {
                    return Ok(Err(format!(
                        "CPython {}.{} in {} (supported: 3.10 to 3.13)",
                        version.0,
                        version.1,
                        path.display()
                    )));
                }
                return Ok(Ok(Interpreter {
                    path: path.clone(),
                    version,
                    runtime,
                }));
            }
            None => reasons.push(format!("{}: no _PyRuntime", path.display())),
        }
    }
    Ok(Err(reasons.join("; ")))
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
/// `_PyRuntime`. The file is read through `/proc/PID/root` so that a process in another mount
/// namespace is read from its own files; where that path is gone (a file deleted or replaced
/// since the process mapped it, shown as `PATH (deleted)`), through `/proc/PID/map_files`.
fn runtime_of(
    pid: u32,
    path: &std::path::Path,
    mappings: &[Mapping],
) -> Result<Option<(u64, Option<u64>)>> {
    let by_root =
        PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    let (on_host, file) = match std::fs::File::open(&by_root) {
        Ok(file) => (by_root, file),
        Err(e) => {
            let &(start, end, _) = mappings.first().expect("a mapped file has a mapping");
            let by_mapping = PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"));
            match std::fs::File::open(&by_mapping) {
                Ok(file) => (by_mapping, file),
                Err(_) => {
                    return Err(anyhow::Error::from(e)
                        .context(format!("open {}", by_root.display()))
                        .into())
                }
            }
        }
    };
    // SAFETY: the map is read-only and private; a file changed under it would at worst give
    // wrong symbol values, which the reads of process memory then fail on.
    let data = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("map {}", on_host.display()))?;
    let elf =
        object::File::parse(&*data).with_context(|| format!("parse {}", on_host.display()))?;
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
    let bias = load_bias(&elf, mappings)
        .ok_or_else(|| anyhow!("{}: no mapping matches a loadable segment", path.display()))?;
    Ok(Some((
        runtime.wrapping_add(bias),
        symbol("Py_Version").map(|a| a.wrapping_add(bias)),
    )))
}

/// The difference between the object's runtime and link-time addresses, from a mapping whose
/// file offset is a loadable segment's (page-aligned) start.
fn load_bias(elf: &object::File, mappings: &[Mapping]) -> Option<u64> {
    const PAGE: u64 = 4096;
    for segment in elf.segments() {
        let (file_offset, _) = segment.file_range();
        let aligned_offset = file_offset & !(PAGE - 1);
        if let Some(&(start, _, _)) = mappings.iter().find(|m| m.2 == aligned_offset) {
            let aligned_vaddr = segment.address() & !(PAGE - 1);
            return Some(start.wrapping_sub(aligned_vaddr));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::version_from_name;
    use std::path::Path;

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
