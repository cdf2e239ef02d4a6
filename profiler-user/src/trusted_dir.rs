//! Directories bpfprof writes in as root (the daemon's state, the export spools, the unwind
//! table cache), opened so that no other user can steer a write or a delete elsewhere.
//!
//! A directory is reached from `/` one component at a time, each opened relative to the one
//! before with `O_NOFOLLOW|O_DIRECTORY` and checked on its open descriptor, as sshd's
//! `StrictModes` checks the path to a key: every component must belong to root or to the
//! running user and be writable by nobody else; a world-writable sticky folder such as `/tmp`
//! is allowed on the way (not as the directory itself) when root owns it, since others can
//! neither rename nor delete what is in it. A symbolic link on the way is followed only when
//! root or the running user owns it, since nobody else could have made or changed it there
//! (a system's `/var/run -> /run`); any other is refused. Past the checks, every file is
//! created, read, renamed and deleted relative to the open descriptor: temporary files with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, reads with `O_NOFOLLOW|O_NONBLOCK` and regular files only.

use std::{
    collections::VecDeque,
    ffi::OsString,
    fs::File,
    io::Write,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::ffi::OsStringExt,
    },
    path::{Component, Path, PathBuf},
};

use rustix::{
    fs::{self as rfs, AtFlags, FileType, Mode, OFlags, CWD},
    io::Errno,
};

/// Most symbolic links followed in one path, as the kernel's own limit (`ELOOP`).
const MAX_LINKS: usize = 40;
/// Mode of a folder created on the way to the one asked for (as `mkdir -p`).
const PARENT_MODE: u32 = 0o755;

/// Why a directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A component of its path could let another user steer what is written.
    #[error("refusing {path}: {reason}")]
    Untrusted {
        /// The component refused.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The directory could not be opened or created (missing, a read-only file system...).
    #[error("{path}: {source}")]
    Io {
        /// The component that failed.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl DirError {
    fn io(path: &Path, source: impl Into<std::io::Error>) -> DirError {
        DirError::Io {
            path: path.to_path_buf(),
            source: source.into(),
        }
    }

    fn untrusted(path: &Path, reason: String) -> DirError {
        DirError::Untrusted {
            path: path.to_path_buf(),
            reason,
        }
    }
}

/// A directory opened by [`TrustedDir::open`]: every later access goes through its
/// descriptor.
#[derive(Debug)]
pub struct TrustedDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl AsFd for TrustedDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A directory on the walk: its descriptor and the path it was reached by.
struct Step {
    fd: OwnedFd,
    path: PathBuf,
}

impl TrustedDir {
    /// Opens directory `path` (relative to the working directory if not absolute), every
    /// component checked from `/`. With `create`, missing components are made (`0755`, the
    /// last one with mode `create`) and the last one is set to mode `create` exactly.
    pub fn open(path: &Path, create: Option<u32>) -> Result<TrustedDir, DirError> {
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| DirError::io(path, e))?
                .join(path)
        };
        walk(vec![root()?], components(&absolute), create, path)
    }

    /// Opens (with `create`, creating with that mode) the folder `name` in this one, checked
    /// as [`TrustedDir::open`] checks the last component.
    pub fn subdir(&self, name: &str, create: Option<u32>) -> Result<TrustedDir, DirError> {
        let path = self.path.join(name);
        ensure_plain_name(name).map_err(|e| DirError::io(&path, e))?;
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| DirError::io(&self.path, e))?;
        let stack = vec![Step {
            fd,
            path: self.path.clone(),
        }];
        walk(stack, VecDeque::from([name.into()]), create, &path)
    }

    /// The path it was opened by, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates `name` here, new (never through a link), with mode `mode`.
    pub fn create_new(&self, name: &str, mode: u32) -> std::io::Result<File> {
        create_new(&self.fd, name, mode)
    }

    /// Writes `bytes` as `name` whole: into the new temporary file `temp` (a leftover of the
    /// same name is replaced), synced if `sync`, then renamed over `name`; with `sync` the
    /// rename is synced too. A failure leaves no temporary file behind.
    pub fn write_whole(
        &self,
        name: &str,
        temp: &str,
        bytes: &[u8],
        mode: u32,
        sync: bool,
    ) -> std::io::Result<()> {
        ensure_plain_name(name)?;
        let _ = self.remove(temp);
        let written = (|| {
            let mut file = self.create_new(temp, mode)?;
            file.write_all(bytes)?;
            if sync {
                file.sync_all()?;
            }
            drop(file);
            rfs::renameat(&self.fd, temp, &self.fd, name)?;
            if sync {
                rfs::fsync(&self.fd)?;
            }
            Ok(())
        })();
        if written.is_err() {
            let _ = self.remove(temp);
        }
        written
    }

    /// Opens `name` here for reading, if it is a regular file: a link fails, and a FIFO
    /// neither blocks the open nor is read.
    pub fn open_regular(&self, name: &str) -> std::io::Result<File> {
        open_regular(&self.fd, name)
    }

    /// Removes file `name` here (a link itself, never what it points to).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        ensure_plain_name(name)?;
        Ok(rfs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }

    /// Renames `name` here to `to` in `dir`.
    pub fn rename_to(&self, name: &str, dir: &TrustedDir, to: &str) -> std::io::Result<()> {
        ensure_plain_name(name)?;
        ensure_plain_name(to)?;
        Ok(rfs::renameat(&self.fd, name, &dir.fd, to)?)
    }

    /// The entries here (`.` and `..` left out), each with its own status (a link's, not
    /// what it points to); an entry gone meanwhile is left out.
    pub fn entries(&self) -> std::io::Result<Vec<(String, rfs::Stat)>> {
        let mut out = Vec::new();
        for entry in rfs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            if let Ok(stat) = rfs::statat(&self.fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                out.push((name, stat));
            }
        }
        Ok(out)
    }
}

/// `/`, checked as a folder on the way.
fn root() -> Result<Step, DirError> {
    let root = Path::new("/");
    let fd =
        rfs::openat(CWD, root, dir_flags(), Mode::empty()).map_err(|e| DirError::io(root, e))?;
    check(&fd, root, false)?;
    Ok(Step {
        fd,
        path: root.to_path_buf(),
    })
}

/// The flags every folder on the way is opened with.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The names of `path`'s components after `/`, `.` left out and `..` kept.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Walks `todo` from the last folder of `stack` (each folder checked), following trusted
/// links, creating what is missing with `create`.
fn walk(
    mut stack: Vec<Step>,
    mut todo: VecDeque<OsString>,
    create: Option<u32>,
    asked: &Path,
) -> Result<TrustedDir, DirError> {
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let last = todo.is_empty();
        if name == ".." {
            // Back to the folder it was reached from: already checked, and no link
            // resolution depends on where `..` of a folder really is.
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let parent = stack.last().expect("the walk starts at a folder");
        let path = parent.path.join(&name);
        let stat = match rfs::statat(&parent.fd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) if create.is_some() => {
                let mode = if last {
                    create.unwrap_or(PARENT_MODE)
                } else {
                    PARENT_MODE
                };
                match rfs::mkdirat(&parent.fd, name.as_os_str(), Mode::from_raw_mode(mode)) {
                    // Made by someone else meanwhile: checked as found.
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(DirError::io(&path, e)),
                }
                todo.push_front(name);
                continue;
            }
            Err(e) => return Err(DirError::io(&path, e)),
        };
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            let me = rustix::process::geteuid().as_raw();
            if stat.st_uid != 0 && stat.st_uid != me {
                return Err(DirError::untrusted(
                    &path,
                    format!(
                        "it is a symbolic link made by uid {}, not by root or this user \
                         (uid {me}); give the path it leads to if that is meant",
                        stat.st_uid
                    ),
                ));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(DirError::io(&path, Errno::LOOP));
            }
            let target = rfs::readlinkat(&parent.fd, name.as_os_str(), Vec::new())
                .map_err(|e| DirError::io(&path, e))?;
            let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
            if target.is_absolute() {
                stack = vec![root()?];
            }
            for component in components(&target).into_iter().rev() {
                todo.push_front(component);
            }
            continue;
        }
        let fd = match rfs::openat(&parent.fd, name.as_os_str(), dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            // Replaced by a link since it was looked at.
            Err(Errno::LOOP) => {
                return Err(DirError::untrusted(
                    &path,
                    "it became a symbolic link while it was opened".into(),
                ))
            }
            Err(e) => return Err(DirError::io(&path, e)),
        };
        check(&fd, &path, last)?;
        if last {
            if let Some(mode) = create {
                // mkdir's mode went through the umask, and an existing folder may be more
                // open than asked (nobody else can write it: checked).
                rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| DirError::io(&path, e))?;
            }
        }
        stack.push(Step { fd, path });
    }
    let last = stack.pop().expect("the walk starts at a folder");
    // Checked as the directory written in: the walk may have ended at a folder checked as
    // one on the way (after `..`, or at `/`).
    check(&last.fd, &last.path, true)?;
    Ok(TrustedDir {
        fd: last.fd,
        path: asked.to_path_buf(),
    })
}

/// Whether the folder open as `fd` (reached as `path`) may be on the way (`last` false) or be
/// the directory written in (`last`).
fn check(fd: &OwnedFd, path: &Path, last: bool) -> Result<(), DirError> {
    let stat = rfs::fstat(fd).map_err(|e| DirError::io(path, e))?;
    let me = rustix::process::geteuid().as_raw();
    let owner_ok = if last {
        stat.st_uid == me
    } else {
        stat.st_uid == 0 || stat.st_uid == me
    };
    if !owner_ok {
        let whom = if last || me == 0 {
            format!("uid {me}")
        } else {
            format!("root or uid {me}")
        };
        return Err(DirError::untrusted(
            path,
            format!(
                "it belongs to uid {}, not to {whom}: another user could replace what is \
                 written there",
                stat.st_uid
            ),
        ));
    }
    let mode = stat.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && (last || !sticky || stat.st_uid != 0) {
        let who = if mode & 0o002 != 0 {
            "every user"
        } else {
            "its group"
        };
        return Err(DirError::untrusted(
            path,
            format!(
                "{who} may write in it (mode {mode:o}): another user could plant links there; \
                 make it writable by its owner only"
            ),
        ));
    }
    Ok(())
}

/// Refuses a name that is not one entry of a folder.
fn ensure_plain_name(name: &str) -> std::io::Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    Ok(())
}

/// Creates `name` under `dir`: new, never through a link, with exactly `mode`.
pub fn create_new(dir: impl AsFd, name: &str, mode: u32) -> std::io::Result<File> {
    ensure_plain_name(name)?;
    let fd = rfs::openat(
        &dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    // The mode given to open went through the umask.
    rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    Ok(File::from(fd))
}

/// Opens `name` under `dir` for reading if it is a regular file: a link fails, and a FIFO
/// neither blocks the open nor is read.
pub fn open_regular(dir: impl AsFd, name: &str) -> std::io::Result<File> {
    ensure_plain_name(name)?;
    let fd = rfs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let file = File::from(fd);
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{name} is not a regular file"),
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn refused(result: Result<TrustedDir, DirError>) -> (PathBuf, String) {
        match result {
            Err(DirError::Untrusted { path, reason }) => (path, reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    /// A private folder to build trees in (under `/tmp`: root's sticky folder, allowed on the
    /// way).
    fn base() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        dir
    }

    #[test]
    fn creates_each_missing_folder_and_sets_the_last_ones_mode() {
        let base = base();
        let path = base.path().join("a/b/c");
        let dir = TrustedDir::open(&path, Some(0o700)).unwrap();
        assert_eq!(dir.path(), path);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&path), 0o700);
        assert_eq!(mode(&base.path().join("a")) & 0o022, 0);
        // Opened again, found; a folder more open than asked is closed.
        chmod(&path, 0o755);
        TrustedDir::open(&path, Some(0o700)).unwrap();
        assert_eq!(mode(&path), 0o700);
        // Without `create` a missing folder is an I/O error, not a refusal.
        assert!(matches!(
            TrustedDir::open(&base.path().join("missing"), None),
            Err(DirError::Io { .. })
        ));
        // `..` and `.` are walked as the kernel would.
        let again = base.path().join("a/./b/../b/c");
        TrustedDir::open(&again, None).unwrap();
    }

    #[test]
    fn files_are_written_whole_read_renamed_and_removed_through_the_folder() {
        let base = base();
        let dir = TrustedDir::open(&base.path().join("d"), Some(0o700)).unwrap();
        let sub = dir.subdir("sub", Some(0o700)).unwrap();
        dir.write_whole("f", ".f.tmp", b"abc", 0o600, true).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut dir.open_regular("f").unwrap(), &mut text).unwrap();
        assert_eq!(text, "abc");
        dir.rename_to("f", &sub, "g").unwrap();
        let names: Vec<String> = sub.entries().unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(names, vec!["g".to_string()]);
        sub.remove("g").unwrap();
        assert!(sub.entries().unwrap().is_empty());
        assert!(dir.remove("../x").is_err());
        assert!(dir.subdir("..", None).is_err());
    }

    #[test]
    fn a_link_planted_where_a_file_is_written_is_replaced_never_followed() {
        let base = base();
        let dir = TrustedDir::open(&base.path().join("d"), Some(0o700)).unwrap();
        let victim = base.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        symlink(&victim, base.path().join("d/.tmp")).unwrap();
        symlink(&victim, base.path().join("d/out")).unwrap();
        symlink(&victim, base.path().join("d/read")).unwrap();
        assert!(dir.create_new(".tmp", 0o600).is_err());
        assert!(dir.open_regular("read").is_err());
        dir.write_whole("out", ".tmp", b"new", 0o600, false)
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(base.path().join("d/out"))
            .unwrap()
            .is_file());
        // A FIFO neither blocks nor is read.
        rfs::mknodat(
            CWD,
            base.path().join("d/fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(dir.open_regular("fifo").is_err());
    }

    #[test]
    fn folders_others_may_write_or_own_are_refused_naming_the_component() {
        let base = base();
        // Writable by every user, or by the group, anywhere on the path.
        for (mode, says) in [(0o777, "every user"), (0o775, "its group")] {
            let open = base.path().join(format!("open{mode:o}"));
            std::fs::create_dir(&open).unwrap();
            chmod(&open, mode);
            let (path, reason) = refused(TrustedDir::open(&open.join("state"), Some(0o700)));
            assert_eq!(path, open);
            assert!(reason.contains(says), "{reason}");
            assert!(
                !open.join("state").exists(),
                "nothing is made past a refusal"
            );
            let (path, _) = refused(TrustedDir::open(&open, Some(0o700)));
            assert_eq!(path, open);
        }
        // A sticky folder that root owns (as /tmp) is allowed on the way, not as the folder
        // written in.
        let sticky = base.path().join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        chmod(&sticky, 0o1777);
        TrustedDir::open(&sticky.join("state"), Some(0o700)).unwrap();
        refused(TrustedDir::open(&sticky, None));
        // Another user's folder, on the way or as the folder itself (root's own check:
        // its euid is the running user's).
        if rustix::process::geteuid().is_root() {
            let theirs = base.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let (path, reason) = refused(TrustedDir::open(&theirs.join("state"), Some(0o700)));
            assert_eq!(path, theirs);
            assert!(reason.contains("uid 65534"), "{reason}");
            // Even sticky: only root's sticky folders are trusted on the way.
            chmod(&theirs, 0o1777);
            refused(TrustedDir::open(&theirs.join("state"), Some(0o700)));
        }
    }

    #[test]
    fn links_are_followed_only_when_root_or_this_user_made_them() {
        let base = base();
        let real = base.path().join("real");
        std::fs::create_dir(&real).unwrap();
        // Root's own link (as /var/run -> /run): followed, relative or absolute.
        symlink("real", base.path().join("relative")).unwrap();
        symlink(&real, base.path().join("absolute")).unwrap();
        for link in ["relative", "absolute"] {
            TrustedDir::open(&base.path().join(link).join("state"), Some(0o700)).unwrap();
        }
        assert!(real.join("state").is_dir());
        // A loop ends.
        symlink("loop", base.path().join("loop")).unwrap();
        assert!(matches!(
            TrustedDir::open(&base.path().join("loop"), None),
            Err(DirError::Io { .. })
        ));
        if rustix::process::geteuid().is_root() {
            // Another user's link, even in a folder only root writes: refused.
            let theirs = base.path().join("theirs");
            symlink(&real, &theirs).unwrap();
            std::os::unix::fs::lchown(&theirs, Some(65534), None).unwrap();
            let (path, reason) = refused(TrustedDir::open(&theirs.join("state"), Some(0o700)));
            assert_eq!(path, theirs);
            assert!(reason.contains("symbolic link"), "{reason}");
        }
    }
}
