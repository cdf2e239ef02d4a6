//! Symbols of a stripped system library from its separate debug file (Debian's `-dbg`
//! packages: `/usr/lib/debug/.build-id/xx/yyyy.debug`), read from its symbol table alone.
//!
//! The library's own `.dynsym` names only its exports: libc's `start_thread` and
//! `__libc_start_call_main` are in the debug file's `.symtab`. blazesym finds that file by
//! itself when it reads DWARF, but then it also decompresses the file's DWARF (libc's: 18 ms
//! of CPU and 10 MiB kept for the run, on a target's CPUs, half of a short run's naming and a
//! third of its peak memory) for what the symbol table gives as well: the function's name.
//! Inlined functions and source lines inside system libraries are what is left out; they
//! come back with `--line-numbers`, which reads the DWARF as before.
//!
//! Without a file under its build id, the object's `.gnu_debuglink` (a file name and the
//! CRC-32 of the debug file) is followed as gdb does: that name beside the object, in a
//! `.debug` folder beside it, then under `/usr/lib/debug` followed by the object's folder;
//! the first file there whose CRC matches. Only a root-owned file nobody else can write is
//! read (it may lie in a folder the target's user owns: another user could truncate a file
//! of theirs under the mapping), and through the descriptor that was checked.
//!
//! Those places are looked up in the root of the process that maps the object (its chroot,
//! its container: `/proc/PID/root`), as that process would see them: a Python in a chroot at
//! `/srv/sid` has its debug files in `/srv/sid/usr/lib/debug`, and its `.gnu_debuglink`
//! file under `/srv/sid/usr/lib/debug/usr/bin`, not `/usr/lib/debug/srv/sid/usr/bin`. That
//! root may be a user's own (a chroot in a user namespace), so no lookup leaves it: its
//! symlinks are followed as from inside it, `..` stops at it, and `/proc` links are refused
//! (see [`ProcessRoot::open`]); the file found must still be root's and read-only.

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object, ObjectSegment};

use crate::process::target_file::{
    gnu_build_id, map_stable, user_writable, ElfReader, ProcessRoot,
};

/// Where Debian (and most distributions) install debug files by build id.
const BUILD_ID_DIR: &str = "/usr/lib/debug/.build-id";

/// Where gdb looks for a `.gnu_debuglink` file under the object's own folder's path.
const GLOBAL_DEBUG_DIR: &str = "/usr/lib/debug";

/// A stripped object's debug file, and how to place the object's file offsets in it.
#[derive(Clone, Debug)]
pub struct DebugSymbols {
    /// The debug file (its symbol table is read; its DWARF is not).
    pub path: PathBuf,
    /// The object's loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
    /// The checked descriptor `path` names (`/proc/self/fd/N`): kept open as long as
    /// blazesym may open it by that path.
    _held: Option<Arc<File>>,
}

impl DebugSymbols {
    /// The debug file of the object at `path` (a descriptor's `/proc/self/fd/N`), which the
    /// process whose root is `root` maps as `seen` (its path as this process sees it) with GNU
    /// build id `build_id` (hex), where the object has no symbol table of its own and a debug
    /// file of that build id installed in that root (or, without one, the file its
    /// `.gnu_debuglink` names there) has one; `None` otherwise (blazesym then reads the object
    /// as before). A process in a chroot or a container has its debug files in its own tree,
    /// as perf and gdb (with its sysroot) look for them.
    pub fn find(
        path: &Path,
        seen: &Path,
        root: &ProcessRoot,
        build_id: Option<&str>,
    ) -> Option<DebugSymbols> {
        let build_id =
            build_id.filter(|id| id.len() > 2 && id.bytes().all(|b| b.is_ascii_hexdigit()));
        let data = map_stable(path)?;
        let object = object::File::parse(&*data).ok()?;
        if object.section_by_name(".symtab").is_some() {
            return None;
        }
        let segments: Vec<(u64, u64, u64)> = object
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let Some(build_id) = build_id else {
            return Self::find_linked(seen, root, &object, segments);
        };
        let debug = Path::new(BUILD_ID_DIR)
            .join(&build_id[..2])
            .join(format!("{}.debug", &build_id[2..]));
        let Ok(file) = root.open(&debug) else {
            return Self::find_linked(seen, root, &object, segments);
        };
        let file = trusted(file, &debug)?;
        // The file at that name must be that build's, with a symbol table to read.
        let reader = ElfReader::new(file.try_clone().ok()?);
        let id: String = gnu_build_id(&reader)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if id != build_id {
            return None;
        }
        Self::with_symbols(file, segments)
    }

    /// The debug file `object` (mapped as `seen` by a process whose root is `root`) names in
    /// its `.gnu_debuglink`, where one is installed with a symbol table (see the notes above).
    fn find_linked(
        seen: &Path,
        root: &ProcessRoot,
        object: &object::File<'_>,
        segments: Vec<(u64, u64, u64)>,
    ) -> Option<DebugSymbols> {
        let (name, crc) = object.gnu_debuglink().ok()??;
        let name = std::str::from_utf8(name).ok()?;
        // A file name, as the section holds one: never a path out of the folders searched.
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return None;
        }
        // The object's folder as its process sees it (the maps' path, inside its root).
        let inside = root.inside(seen);
        let dir = inside.parent().filter(|d| d.is_absolute())?;
        let global = Path::new(GLOBAL_DEBUG_DIR).join(dir.strip_prefix("/").ok()?);
        for candidate in [
            dir.join(name),
            dir.join(".debug").join(name),
            global.join(name),
        ] {
            let Some(file) = root
                .open(&candidate)
                .ok()
                .and_then(|f| trusted(f, &candidate))
            else {
                continue;
            };
            if crc32_of(&file) != Some(crc) {
                log::debug!("{}: not the debug file linked (CRC)", candidate.display());
                continue;
            }
            return Self::with_symbols(file, segments);
        }
        None
    }

    /// The debug file opened as `file` (checked), read through its descriptor, if it has a
    /// symbol table.
    fn with_symbols(file: File, segments: Vec<(u64, u64, u64)>) -> Option<DebugSymbols> {
        use std::os::fd::AsRawFd;
        let held = Arc::new(file);
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        let data = map_stable(&by_fd)?;
        let debug_object = object::File::parse(&*data).ok()?;
        debug_object.section_by_name(".symtab")?;
        Some(DebugSymbols {
            path: by_fd,
            segments,
            _held: Some(held),
        })
    }

    /// The virtual address (as the symbol tables give them) of `file_offset` in the object.
    pub fn virt_offset(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(offset, size, _)| (*offset..offset + size).contains(&file_offset))
            .map(|(offset, _, address)| address + (file_offset - offset))
    }
}

/// `file` (opened as `path`) if it is a regular file that root owns and nobody else can
/// write (see the module's notes), as its descriptor says.
fn trusted(file: File, path: &Path) -> Option<File> {
    let stat = rustix::fs::fstat(&file).ok()?;
    let regular =
        rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
    if !regular || user_writable(&stat) {
        log::debug!("{}: not a root-owned read-only file", path.display());
        return None;
    }
    Some(file)
}

/// The CRC-32 of the whole file (the `.gnu_debuglink` checksum: zlib's CRC-32).
fn crc32_of(mut file: &File) -> Option<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Some(hasher.finalize()),
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libc (stripped, with libc6-dbg installed by `cargo xtask setup`) is named from its
    /// debug file: `start_thread` is in no table of libc.so.6 itself.
    #[test]
    fn libc_is_found_with_its_debug_file_and_offsets_land_in_its_text() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let reader = ElfReader::new(std::fs::File::open(libc).unwrap());
        let id: String = gnu_build_id(&reader)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let host = ProcessRoot::at(Path::new("/")).unwrap();
        let debug =
            DebugSymbols::find(libc, libc, &host, Some(&id)).expect("libc6-dbg's debug file");
        let real = std::fs::read_link(&debug.path).unwrap();
        assert!(real.starts_with(BUILD_ID_DIR), "{}", real.display());
        // blazesym reads the debug file's symbols at virtual addresses: where start_thread is.
        use blazesym::symbolize::{source, Input, Symbolizer};
        let inspector = blazesym::inspect::Inspector::new();
        let found = inspector
            .lookup(
                &blazesym::inspect::source::Source::Elf(blazesym::inspect::source::Elf::new(
                    &debug.path,
                )),
                &["start_thread"],
            )
            .unwrap();
        let start = found[0]
            .first()
            .expect("start_thread in the debug file")
            .addr;
        let file_offset = debug
            .segments
            .iter()
            .find(|(_, size, address)| (*address..address + size).contains(&start))
            .map(|(offset, _, address)| offset + (start - address))
            .unwrap();
        assert_eq!(debug.virt_offset(file_offset + 4), Some(start + 4));
        let mut elf = source::Elf::new(&debug.path);
        elf.debug_syms = false;
        let symbolizer = Symbolizer::new();
        let named = symbolizer
            .symbolize(&source::Source::Elf(elf), Input::VirtOffset(&[start + 4]))
            .unwrap();
        assert_eq!(named[0].as_sym().map(|s| &*s.name), Some("start_thread"));

        // An object with a symbol table of its own, or a build id with no file: not found.
        let exe = Path::new("/proc/self/exe");
        assert!(DebugSymbols::find(exe, exe, &host, Some(&id)).is_none());
        assert!(DebugSymbols::find(libc, libc, &host, Some("00ff")).is_none());
        assert!(DebugSymbols::find(libc, libc, &host, Some("../../etc")).is_none());
        assert!(DebugSymbols::find(libc, libc, &host, None).is_none());
    }

    /// A stripped program with a `.gnu_debuglink` to a debug file beside it (made as a
    /// distribution makes one: `objcopy --only-keep-debug`, then `--add-gnu-debuglink`) is
    /// named from that file's symbol table; a file of that name with another CRC, or one
    /// another user could write, is not read.
    #[test]
    fn a_debuglink_file_beside_the_object_is_found_and_checked() {
        use std::{os::fd::AsRawFd, os::unix::fs::PermissionsExt, process::Command};
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipping: debug files are trusted when root owns them");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("linked.c");
        std::fs::write(
            &source,
            "volatile int sink; __attribute__((noinline)) void linked_work(void) { sink++; }\n\
             int main(void) { linked_work(); return 0; }\n",
        )
        .unwrap();
        let bin = dir.path().join("linked");
        let debug = dir.path().join("linked.debug");
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let status = Command::new(program).args(args).status().unwrap();
            assert!(status.success(), "{program} {args:?}");
        };
        run(
            "cc",
            &[
                "-O1".as_ref(),
                "-g".as_ref(),
                "-o".as_ref(),
                bin.as_os_str(),
                source.as_os_str(),
            ],
        );
        run(
            "objcopy",
            &[
                "--only-keep-debug".as_ref(),
                bin.as_os_str(),
                debug.as_os_str(),
            ],
        );
        run("strip", &["--strip-all".as_ref(), bin.as_os_str()]);
        let link = format!("--add-gnu-debuglink={}", debug.display());
        run("objcopy", &[link.as_ref(), bin.as_os_str()]);
        std::fs::set_permissions(&debug, std::fs::Permissions::from_mode(0o644)).unwrap();
        // As the symbolizer opens objects: by a descriptor.
        let object = File::open(&bin).unwrap();
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", object.as_raw_fd()));
        let host = ProcessRoot::at(Path::new("/")).unwrap();
        let found = DebugSymbols::find(&by_fd, &bin, &host, None).expect("the linked debug file");
        assert_eq!(
            std::fs::canonicalize(&found.path).unwrap(),
            std::fs::canonicalize(&debug).unwrap()
        );
        // Its symbol table names the function the stripped object no longer does.
        use blazesym::inspect::{source::Elf as InspectElf, source::Source as InspectSource};
        let inspector = blazesym::inspect::Inspector::new();
        let found_sym = inspector
            .lookup(
                &InspectSource::Elf(InspectElf::new(&found.path)),
                &["linked_work"],
            )
            .unwrap();
        assert!(!found_sym[0].is_empty(), "linked_work in the debug file");
        drop(found);

        // Nobody but root may be able to write the file read.
        std::fs::set_permissions(&debug, std::fs::Permissions::from_mode(0o664)).unwrap();
        assert!(
            DebugSymbols::find(&by_fd, &bin, &host, None).is_none(),
            "a group-writable debug file"
        );
        std::fs::set_permissions(&debug, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Another file under that name (its CRC differs) is not the one linked.
        let mut bytes = std::fs::read(&debug).unwrap();
        bytes.push(0);
        std::fs::write(&debug, bytes).unwrap();
        assert!(
            DebugSymbols::find(&by_fd, &bin, &host, None).is_none(),
            "a debug file of another CRC"
        );
    }
}
