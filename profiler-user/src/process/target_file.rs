//! Opening and reading the files a target controls (its JIT perf map, the objects it maps, its
//! interpreter) as hostile input: the root daemon reads them for every user (issue 23). Every
//! open is `O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC` and must give a regular file, so that a FIFO, a
//! device or a link planted where a file was expected neither blocks nor leaks; reads are
//! `pread`s into bounded buffers, never `mmap`s of a file its owner could truncate under us
//! (a truncated mapping faults the daemon with SIGBUS).

use std::{
    cell::Cell,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::FileExt,
    path::Path,
    sync::Arc,
};

use crate::process::copies::{CopyBudget, SealedCopy};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, Stat};

/// Largest perf map read (a JIT's `/tmp/perf-PID.map`): a large Node or JVM service writes a
/// few MiB; the rest of a larger file is left unread (with a warning), so that a target cannot
/// make the daemon hold or parse more than this.
pub const PERF_MAP_MAX_BYTES: u64 = 16 << 20;

/// Bytes read from one object file for its symbols or unwind tables: a 430 MB libtorch_cpu.so
/// needs about 30 MiB (its `.eh_frame` and headers). A file claiming more is refused rather
/// than read, so that a forged section size cannot make the daemon allocate it.
pub const ELF_READ_BUDGET: u64 = 256 << 20;

/// Largest file that a target's user could truncate that is copied into a sealed memory file
/// for symbolization (see [`stable`]); a larger one is symbolized as `module+0xOFFSET`. The
/// copy lives while a run symbolizes, in the daemon's memory.
pub const SNAPSHOT_MAX_BYTES: u64 = 128 << 20;

/// The flags of every open of a path a target controls: the last component is never
/// followed, a FIFO or device never blocks the open, and the descriptor stays in the daemon.
fn flags() -> OFlags {
    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY
}

/// `file` if it is a regular file (a FIFO, device, socket or directory is an error).
fn regular(file: File) -> io::Result<(File, Stat)> {
    let stat = rustix::fs::fstat(&file)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok((file, stat))
}

/// Opens `path`, a kernel's link to a target's file (`/proc/PID/map_files/START-END`: the
/// mapped object itself), as a regular file. The link is followed (that is its use; the
/// kernel, not the target, made it), but never blocks nor gives anything but a regular file.
pub fn open_proc_link(path: &Path) -> io::Result<(File, Stat)> {
    regular(rustix::fs::open(path, flags() - OFlags::NOFOLLOW, Mode::empty())?.into())
}

/// Opens `relative` inside the root directory of process `pid` (its mount namespace) as a
/// regular file, following no symlink on the way (so the file is what that path names in the
/// target's own tree, not something a link planted there points at) and never leaving that
/// root.
pub fn open_in_root(pid: u32, relative: &Path) -> io::Result<(File, Stat)> {
    let root = rustix::fs::open(
        format!("/proc/{pid}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    let fd = rustix::fs::openat2(
        &root,
        relative,
        flags(),
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    regular(fd.into())
}

/// The root directory of a process (`/proc/PID/root`: its chroot, or its container's root),
/// held open so that its files can be looked up after the process is gone, and inside which
/// every lookup stays: the root's contents belong to whoever made it (a user's own chroot in
/// a user namespace), so a symlink or `..` there must not lead to the host's files.
#[derive(Debug)]
pub struct ProcessRoot {
    /// The root directory (an `O_PATH` descriptor of what `/proc/PID/root` pointed at).
    dir: std::os::fd::OwnedFd,
    /// Its path as this process sees it (`/srv/sid` for a chroot there; `/` for the host's
    /// own root and for a root out of this process's reach, such as a container's).
    seen_as: std::path::PathBuf,
}

impl ProcessRoot {
    /// The root of process `pid`, while it lives.
    pub fn of(pid: u32) -> io::Result<ProcessRoot> {
        let link = format!("/proc/{pid}/root");
        let dir = rustix::fs::open(
            &link,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // The kernel's name of it relative to this process's root; a root it cannot name so
        // (another mount namespace's) reads as something not absolute, or as `/`.
        let seen_as = std::fs::read_link(&link)
            .ok()
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| "/".into());
        Ok(ProcessRoot { dir, seen_as })
    }

    /// The directory `path` (as this process sees it) taken as a root: this process's own
    /// root for `/`.
    pub fn at(path: &Path) -> io::Result<ProcessRoot> {
        let dir = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ProcessRoot {
            dir,
            seen_as: std::fs::canonicalize(path)?,
        })
    }

    /// Whether it is the same directory as `other` (a process that changed root since).
    pub fn same_as(&self, other: &ProcessRoot) -> bool {
        match (rustix::fs::fstat(&self.dir), rustix::fs::fstat(&other.dir)) {
            (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
            _ => false,
        }
    }

    /// `path`, a path in the process's tree as this process sees it (the maps of a process
    /// in a chroot at `/srv/sid` name `/srv/sid/usr/bin/x`), as the process sees it
    /// (`/usr/bin/x`); unchanged where it is not under the root's path.
    pub fn inside(&self, path: &Path) -> std::path::PathBuf {
        match path.strip_prefix(&self.seen_as) {
            Ok(rest) if self.seen_as != Path::new("/") => Path::new("/").join(rest),
            _ => path.to_path_buf(),
        }
    }

    /// Opens `path` (as the process sees it) read-only inside the root: symlinks are
    /// followed as the process would follow them, an absolute one from the root and `..`
    /// never above it (`RESOLVE_IN_ROOT`), and no `/proc` magic link at all (which would
    /// lead anywhere); a FIFO or device never blocks the open. The caller checks what it got.
    pub fn open(&self, path: &Path) -> io::Result<File> {
        let relative = path.strip_prefix("/").unwrap_or(path);
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(
                &self.dir,
                relative,
                flags() - OFlags::NOFOLLOW,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            ) {
                // The kernel refuses a walk that raced with a rename (it cannot tell whether
                // `..` stayed inside): tried again a few times.
                Err(rustix::io::Errno::AGAIN) if tries < 3 => tries += 1,
                Err(e) => return Err(e.into()),
                Ok(fd) => return Ok(fd.into()),
            }
        }
    }
}

/// Opens the file that process `pid` maps at `start..end` (named `path`, device and inode
/// `dev_ino` in its maps): the mapped object itself through `map_files`, which works across
/// mount namespaces and for deleted files; else the path inside the target's root, accepted
/// only if it is still that device and inode (a deleted file's name may now be anything).
pub fn open_mapped(
    pid: u32,
    (start, end): (u64, u64),
    path: &Path,
    dev_ino: (u64, u64),
) -> io::Result<(File, Stat)> {
    open_proc_link(Path::new(&format!(
        "/proc/{pid}/map_files/{start:x}-{end:x}"
    )))
    .or_else(|_| {
        let (file, stat) = open_in_root(pid, path)?;
        if (stat.st_dev, stat.st_ino) != dev_ino {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the path no longer names the mapped file",
            ));
        }
        Ok((file, stat))
    })
}

/// Up to `cap` bytes from the start of `file` by `pread`, and whether it holds more.
pub fn read_capped(file: &File, cap: u64) -> io::Result<(Vec<u8>, bool)> {
    let mut data = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while (data.len() as u64) < cap {
        let want = chunk.len().min((cap - data.len() as u64) as usize);
        match file.read_at(&mut chunk[..want], data.len() as u64) {
            Ok(0) => return Ok((data, false)),
            Ok(n) => data.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut probe = [0u8; 1];
    let more = file.read_at(&mut probe, cap)? > 0;
    Ok((data, more))
}

/// A file read by `pread` at a position of its own: descriptors duplicated from one file
/// share its seek offset, and several threads read one target's objects.
struct Positional {
    file: File,
    pos: u64,
}

impl Read for Positional {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Positional {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let (base, delta) = match to {
            SeekFrom::Start(at) => (at, 0),
            SeekFrom::End(delta) => (self.file.metadata()?.len(), delta),
            SeekFrom::Current(delta) => (self.pos, delta),
        };
        self.pos = base
            .checked_add_signed(delta)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
        Ok(self.pos)
    }
}

/// An object file read by `pread` on demand (only the ranges a parser asks for, each once),
/// for `object`'s parsers: a file truncated while it is read gives read errors, not SIGBUS.
/// Reads stop at [`ELF_READ_BUDGET`] bytes.
pub struct ElfReader {
    cache: object::read::ReadCache<Positional>,
    read: Cell<u64>,
    over_budget: Cell<bool>,
}

impl ElfReader {
    /// A reader of `file` (which may share its seek offset with other descriptors: it is
    /// not used).
    pub fn new(file: File) -> ElfReader {
        ElfReader {
            cache: object::read::ReadCache::new(Positional { file, pos: 0 }),
            read: Cell::new(0),
            over_budget: Cell::new(false),
        }
    }

    /// Whether a read was refused for going over [`ELF_READ_BUDGET`] (a parse error then
    /// says why: see [`Self::explain`]).
    pub fn over_budget(&self) -> bool {
        self.over_budget.get()
    }

    /// `error`, saying so when the budget refused a read.
    pub fn explain(&self, error: anyhow::Error) -> anyhow::Error {
        if self.over_budget() {
            error.context(format!(
                "the object asks for more than {} MiB of reads",
                ELF_READ_BUDGET >> 20
            ))
        } else {
            error
        }
    }

    fn charge(&self, size: u64) -> Result<(), ()> {
        let total = self.read.get().saturating_add(size);
        if total > ELF_READ_BUDGET {
            self.over_budget.set(true);
            return Err(());
        }
        self.read.set(total);
        Ok(())
    }
}

impl<'a> object::ReadRef<'a> for &'a ElfReader {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        self.charge(size)?;
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(
        self,
        range: std::ops::Range<u64>,
        delimiter: u8,
    ) -> Result<&'a [u8], ()> {
        let bytes = (&self.cache).read_bytes_at_until(range, delimiter)?;
        self.charge(bytes.len() as u64)?;
        Ok(bytes)
    }
}

/// The GNU build id of the ELF file `reader` reads, from its note segments alone (a full
/// `object::File::parse` would also read the whole symbol table, megabytes for a large
/// library, for each process mapping it).
pub fn gnu_build_id(reader: &ElfReader) -> Option<Vec<u8>> {
    match object::FileKind::parse(reader).ok()? {
        object::FileKind::Elf64 => build_id_of::<object::elf::FileHeader64<_>>(reader),
        object::FileKind::Elf32 => build_id_of::<object::elf::FileHeader32<_>>(reader),
        _ => None,
    }
}

fn build_id_of<Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
    reader: &ElfReader,
) -> Option<Vec<u8>> {
    use object::read::elf::ProgramHeader as _;
    let header = Elf::parse(reader).ok()?;
    let endian = header.endian().ok()?;
    for segment in header.program_headers(endian, reader).ok()? {
        let Ok(Some(mut notes)) = segment.notes(endian, reader) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == object::elf::ELF_NOTE_GNU
                && note.n_type(endian) == object::elf::NT_GNU_BUILD_ID
            {
                return Some(note.desc().to_vec());
            }
        }
    }
    None
}

/// Whether the target's user could change or truncate the file `stat` describes: anyone but
/// root owning it, or a group or other write bit (an ACL granting write shows in the group
/// bits). Root's read-only system files cannot be.
pub fn user_writable(stat: &Stat) -> bool {
    stat.st_uid != 0 || stat.st_mode & 0o022 != 0
}

/// A read-only private mapping of the file at `path`, which must be a
/// [`crate::process::maps::MappedFile::open_path`]: a root-owned read-only file or a sealed
/// copy (see [`stable`]), which no target's user can truncate under the mapping. Mapped, not
/// read: readers touch only headers and a few sections (reading a 430 MB libtorch_cpu.so
/// whole took a run's end 0.3 s and as much memory). `None`, logged, when it cannot be.
pub fn map_stable(path: &std::path::Path) -> Option<memmap2::Mmap> {
    let file = File::open(path)
        .map_err(|e| log::debug!("opening {}: {e}", path.display()))
        .ok()?;
    // SAFETY: a read-only private mapping of a file that cannot shrink or change (see above).
    unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| log::debug!("mapping {}: {e}", path.display()))
        .ok()
}

/// A descriptor that readers may `mmap` without SIGBUS (see [`stable`]).
#[derive(Debug)]
pub enum Stable {
    /// The file itself: its user cannot truncate it.
    Own(File),
    /// A sealed copy, counted against its driver's [`CopyBudget`] while held.
    Copy(Arc<SealedCopy>),
}

impl Stable {
    /// The descriptor.
    pub fn file(&self) -> &File {
        match self {
            Stable::Own(file) => file,
            Stable::Copy(copy) => &copy.file,
        }
    }
}

/// A descriptor of `file` that readers may `mmap` (blazesym does) without SIGBUS: the file
/// itself when the target's user cannot truncate it, else a copy in a memory file sealed
/// against shrinking and writing (up to [`SNAPSHOT_MAX_BYTES`]), shared with every other
/// holder of the same object and counted against `budget`. `Err(None)` when the budget
/// refused this object before (said then); `Err(Some(reason))` otherwise.
pub fn stable(file: &File, stat: &Stat, budget: &CopyBudget) -> Result<Stable, Option<String>> {
    if !user_writable(stat) {
        return file
            .try_clone()
            .map(Stable::Own)
            .map_err(|e| Some(e.to_string()));
    }
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > SNAPSHOT_MAX_BYTES {
        return Err(Some(format!(
            "{} MiB, over the {} MiB that a file its user can truncate is copied for \
             symbolization",
            size >> 20,
            SNAPSHOT_MAX_BYTES >> 20
        )));
    }
    let id = crate::process::maps::FileId::of(stat);
    budget
        .copy(&id, || sealed_copy(file, size))
        .map(Stable::Copy)
}

/// The first `size` bytes of `file` in a memory file sealed against shrinking, growing and
/// writing. Ranges of zeros are left as holes (a sparse 120 MiB ELF of 68 KB on disk took
/// 120 MiB of memory when copied whole).
fn sealed_copy(file: &File, size: u64) -> io::Result<File> {
    let memfd: File = rustix::fs::memfd_create(
        "bpfprof-object",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?
    .into();
    memfd.set_len(size)?;
    // By pread, at most the size seen (a file that grows meanwhile is cut there), skipping
    // the file's holes (not even read: reading them filled the page cache with zeros).
    let mut chunk = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    while copied < size {
        match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(copied)) {
            Ok(data) if data > copied => {
                copied = data.min(size);
                continue;
            }
            // Nothing but a hole from here on.
            Err(rustix::io::Errno::NXIO) => break,
            // Data here, or a file system that cannot tell: read.
            _ => {}
        }
        let want = chunk.len().min((size - copied) as usize);
        match file.read_at(&mut chunk[..want], copied) {
            Ok(0) => {
                log::debug!("object shrank while copied: {copied} of {size} bytes");
                memfd.set_len(copied)?;
                break;
            }
            Ok(n) => {
                if chunk[..n].iter().any(|&b| b != 0) {
                    memfd.write_all_at(&chunk[..n], copied)?;
                }
                copied += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::fcntl_add_seals(
        &memfd,
        rustix::fs::SealFlags::SHRINK
            | rustix::fs::SealFlags::GROW
            | rustix::fs::SealFlags::WRITE
            | rustix::fs::SealFlags::SEAL,
    )?;
    Ok(memfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup in a process's root follows the root's own links as the process would, and
    /// none out of it: an absolute link is read from the root, `..` stops at it.
    #[test]
    fn lookups_in_a_root_never_leave_it() {
        let root_dir = tempfile::tempdir().unwrap();
        let r = root_dir.path();
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::fs::write(r.join("usr/lib/real"), b"inside").unwrap();
        let link = |target: &str, name: &str| std::os::unix::fs::symlink(target, r.join(name));
        link("/usr/lib/real", "inside").unwrap();
        // Outside the root (the host's file these would name if followed from here).
        let host_file = std::fs::canonicalize("/etc/hostname")
            .or_else(|_| std::fs::canonicalize("/etc/passwd"))
            .unwrap();
        let host_file = host_file.to_str().unwrap();
        link(host_file, "absolute").unwrap();
        link(&format!("../../../../../../../..{host_file}"), "dotdot").unwrap();
        link("/proc/self/root/etc/passwd", "magic").unwrap();
        let root = ProcessRoot::at(r).unwrap();
        let mut inside = String::new();
        root.open(Path::new("/inside"))
            .unwrap()
            .read_to_string(&mut inside)
            .unwrap();
        assert_eq!(inside, "inside");
        for name in ["/absolute", "/dotdot", "/magic", "/../../etc/passwd"] {
            assert!(root.open(Path::new(name)).is_err(), "{name} left the root");
        }
        // A path as this process sees it, as the rooted process sees it.
        assert_eq!(
            root.inside(&r.canonicalize().unwrap().join("usr/lib/real")),
            Path::new("/usr/lib/real")
        );
        assert_eq!(root.inside(Path::new("/x/y")), Path::new("/x/y"));
    }

    #[test]
    fn fifos_and_links_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(open_in_root(me, &fifo).is_err());
        assert!(open_proc_link(&fifo).is_err());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        assert!(open_in_root(me, &link).is_err());
        let linked_dir = dir.path().join("dir");
        std::os::unix::fs::symlink("/etc", &linked_dir).unwrap();
        assert!(open_in_root(me, &linked_dir.join("hostname")).is_err());
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"0123456789").unwrap();
        let (file, _) = open_in_root(me, &plain).unwrap();
        assert_eq!(read_capped(&file, 4).unwrap(), (b"0123".to_vec(), true));
        assert_eq!(
            read_capped(&file, 10).unwrap(),
            (b"0123456789".to_vec(), false)
        );
    }

    #[test]
    fn snapshots_are_sealed_copies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        std::fs::write(&path, b"ELF image").unwrap();
        let (file, mut stat) = open_proc_link(&path).unwrap();
        stat.st_uid = 1000;
        let budget = CopyBudget::new(1 << 20);
        let copy = stable(&file, &stat, &budget).unwrap();
        assert_eq!(budget.used(), 9);
        std::fs::write(&path, b"").unwrap();
        let mut text = String::new();
        let mut reader = copy.file();
        reader.read_to_string(&mut text).unwrap();
        assert_eq!(text, "ELF image");
        assert!(copy.file().set_len(0).is_err(), "the copy can shrink");
        drop(copy);
        assert_eq!(budget.used(), 0);
    }
}
