//! The files a process maps, opened and identified as the daemon verified them.

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::process::{
    copies::CopyBudget,
    target_file::{ProcessRoot, Stable},
};

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
    pub(super) stat: rustix::fs::Stat,
    /// The GNU build id, read on first use.
    pub(super) build_id: std::sync::OnceLock<Option<String>>,
    /// A descriptor that readers may `mmap`, made on first use (see
    /// [`crate::process::target_file::stable`]): `Some(None)` when none could be made; left
    /// `None` while the copy budget refuses it (a later use tries again).
    pub(super) stable: std::sync::Mutex<Option<Option<Arc<Stable>>>>,
    /// Why it could not be read (the copy budget refused it, or it is too large to copy),
    /// while that holds: the run's summary names it `Unavailable` with this reason.
    pub(super) unavailable: std::sync::Mutex<Option<String>>,
    /// The budget a copy of it counts against.
    pub(super) budget: CopyBudget,
    /// The root of the process that mapped it when it was opened (its chroot or container),
    /// where its debug files are looked for; `None` where it could not be opened.
    pub(super) root: Option<Arc<ProcessRoot>>,
}

impl MappedFile {
    /// A path through which this process can open (and `mmap`, as blazesym does) the file,
    /// whatever the target's namespaces; `None` when the file is one its user could truncate
    /// and too large to copy, or its copy would pass the budget (see
    /// [`crate::process::target_file::stable`]).
    pub fn open_path(&self) -> Option<PathBuf> {
        self.stable().map(|(path, _)| path)
    }

    /// Why the file could not be read for symbolization, if it could not (its frames are
    /// then named `module+0xOFFSET`).
    pub fn unavailable(&self) -> Option<String> {
        self.unavailable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// [`Self::open_path`], with what keeps the descriptor behind it open (and its copy
    /// counted): whoever keeps using the path (blazesym's cache) holds it as long.
    pub fn stable(&self) -> Option<(PathBuf, Arc<Stable>)> {
        use std::os::fd::AsRawFd;
        let mut state = self.stable.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            let unavailable =
                match crate::process::target_file::stable(&self.file, &self.stat, &self.budget) {
                    Ok(stable) => {
                        *state = Some(Some(Arc::new(stable)));
                        None
                    }
                    Err(Some(why)) if why.starts_with(crate::process::copies::EXHAUSTED) => {
                        log::warn!("{} is not symbolized: {why}", self.path.display());
                        Some(why)
                    }
                    // Said once already (by this process or another mapping the object): tried
                    // again at the next use, when copies may have gone.
                    Err(None) => Some(format!(
                        "{} ({} MiB of {} MiB held by copies of other objects)",
                        crate::process::copies::EXHAUSTED,
                        self.budget.used() >> 20,
                        self.budget.limit() >> 20
                    )),
                    Err(Some(why)) => {
                        log::warn!("{} is not symbolized: {why}", self.path.display());
                        *state = Some(None);
                        Some(why)
                    }
                };
            *self.unavailable.lock().unwrap_or_else(|p| p.into_inner()) = unavailable;
        }
        let stable = state.as_ref()?.as_ref()?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", stable.file().as_raw_fd()));
        Some((path, Arc::clone(stable)))
    }

    /// The file's GNU build id in hex, if it has one (pprof mappings carry it so that
    /// symbols can be found again later); read by `pread`, not mapped.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id
            .get_or_init(|| {
                let reader =
                    crate::process::target_file::ElfReader::new(self.file.try_clone().ok()?);
                let id = crate::process::target_file::gnu_build_id(&reader)?;
                Some(id.iter().map(|b| format!("{b:02x}")).collect())
            })
            .as_deref()
    }

    /// The root of the process that mapped it (see [`ProcessRoot`]), where the process's
    /// other files (its debug files) are.
    pub fn root(&self) -> Option<&ProcessRoot> {
        self.root.as_deref()
    }

    /// The file's name without directories, as shown in `module+0xOFFSET` frames.
    pub fn module_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.to_string_lossy().into_owned())
    }
}

/// Opens a mapped file as [`crate::process::target_file::open_mapped`] does (through `map_files`,
/// else its path in the target's root if that is still the mapped file).
pub(super) fn open_mapped(
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
