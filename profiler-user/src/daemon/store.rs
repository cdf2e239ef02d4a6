//! The daemon's state directory: one folder per run holding `run.json` and the result files,
//! so that results survive a restart and runs in flight at a crash are not lost silently.
//!
//! Security model: the daemon runs as root and users must not be able to steer its writes.
//! Every directory here is owned by the daemon and writable only by it (`0711`: a run's owner
//! can open the result files whose names the daemon gave it, but nobody else can create,
//! rename or list entries). Every file is created relative to an open directory fd with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, and its owner and mode are set on the open fd, so no path is
//! ever resolved through something a user could have planted. State is read with
//! `O_NOFOLLOW|O_NONBLOCK`, regular files only, under a size limit, and a run's id comes from
//! the name of the folder the daemon created, never from file contents.

use std::{
    fs::File,
    io::{Read, Write},
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::{
    protocol::{RunInfo, RunState},
    trusted_dir::{self, TrustedDir},
};

/// Mode of every directory of the store: the daemon writes, others may only traverse.
const DIR_MODE: u32 = 0o711;
/// Mode of every file of the store: private to its owner.
const FILE_MODE: u32 = 0o600;
/// Largest `run.json` read back; anything larger was not written by the daemon.
const MAX_STATE_BYTES: u64 = 4 << 20;
/// Name of a run's state file.
const STATE_FILE: &str = "run.json";
/// Temporary name `run.json` is written under before it is renamed into place.
const STATE_TMP: &str = "run.json.tmp";

/// Where runs are kept, with the limits of how many and how long.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    /// The `runs/` folder, opened once: every later access is relative to it.
    runs: TrustedDir,
    /// Most ended runs kept; older ones are deleted first.
    pub keep_runs: usize,
    /// Most ended runs kept per owner, so that one user's many runs cannot evict another's.
    pub keep_runs_per_user: usize,
    /// Ended runs older than this are deleted.
    pub keep_age: Duration,
}

/// What loading the store found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every run that could be read back (interrupted ones marked FAILED).
    pub runs: Vec<RunInfo>,
    /// One more than the highest run folder present, readable or not.
    pub next_id: u64,
}

impl Store {
    /// Opens (creating) the state directory, every folder on its path checked (see
    /// [`crate::trusted_dir`]): one that another user owns or may write is refused, since
    /// the daemon writes there as root.
    pub fn open(
        root: &Path,
        keep_runs: usize,
        keep_runs_per_user: usize,
        keep_age: Duration,
    ) -> crate::Result<Store> {
        let root_dir = TrustedDir::open(root, Some(DIR_MODE))?;
        let runs = root_dir.subdir("runs", Some(DIR_MODE))?;
        Ok(Store {
            root: root.to_path_buf(),
            runs,
            keep_runs,
            keep_runs_per_user,
            keep_age,
        })
    }

    /// The folder of run `id`, as a path for replies and logs.
    pub fn run_dir(&self, id: u64) -> PathBuf {
        self.root.join("runs").join(id.to_string())
    }

    /// Creates the folder of a new run (owned by the daemon; files in it go to their owner).
    pub fn create_run_dir(&self, id: u64) -> Result<()> {
        let name = id.to_string();
        rfs::mkdirat(&self.runs, name.as_str(), Mode::from_raw_mode(DIR_MODE))
            .with_context(|| format!("creating {}", self.run_dir(id).display()))?;
        // mkdir's mode is filtered by the umask; set it exactly.
        let dir = self.open_run_dir(id)?;
        rfs::fchmod(&dir, Mode::from_raw_mode(DIR_MODE))?;
        Ok(())
    }

    fn open_run_dir(&self, id: u64) -> Result<OwnedFd> {
        open_own_dir(&self.runs, id.to_string().as_str())
            .with_context(|| format!("opening {}", self.run_dir(id).display()))
    }

    /// Creates result file `name` of run `id`, new, owned by `owner` and private to them.
    /// Returns the open file and its path.
    pub fn create_result(&self, id: u64, name: &str, owner: u32) -> Result<(File, PathBuf)> {
        ensure_plain_name(name)?;
        let dir = self.open_run_dir(id)?;
        let path = self.run_dir(id).join(name);
        // A leftover of an earlier attempt (the daemon's own) is replaced; unlinkat never
        // follows a link.
        let _ = rfs::unlinkat(&dir, name, AtFlags::empty());
        let fd = create_new(&dir, name).with_context(|| format!("creating {}", path.display()))?;
        rfs::fchown(&fd, Some(rfs::Uid::from_raw(owner)), None)
            .with_context(|| format!("giving {} to uid {owner}", path.display()))?;
        Ok((File::from(fd), path))
    }

    /// Removes result file `name` of run `id` (a partial write).
    pub fn remove_result(&self, id: u64, name: &str) {
        if let Ok(dir) = self.open_run_dir(id) {
            let _ = rfs::unlinkat(&dir, name, AtFlags::empty());
        }
    }

    /// Opens result file `name` of run `id` for reading: a regular file, never a link.
    pub fn open_result(&self, id: u64, name: &str) -> Result<File> {
        ensure_plain_name(name)?;
        let dir = self.open_run_dir(id)?;
        let file = open_regular(&dir, name)?;
        Ok(file)
    }

    /// Writes `run.json` of a run atomically.
    pub fn save(&self, info: &RunInfo) -> Result<()> {
        let dir = self.open_run_dir(info.run_id)?;
        let json = serde_json::to_vec_pretty(info)?;
        let _ = rfs::unlinkat(&dir, STATE_TMP, AtFlags::empty());
        let written = (|| -> Result<()> {
            let mut file = File::from(create_new(&dir, STATE_TMP)?);
            file.write_all(&json)?;
            file.sync_all()?;
            rfs::renameat(&dir, STATE_TMP, &dir, STATE_FILE)?;
            Ok(())
        })();
        if written.is_err() {
            // A full disk must not leave a truncated state file behind.
            let _ = rfs::unlinkat(&dir, STATE_TMP, AtFlags::empty());
        }
        written.with_context(|| {
            format!(
                "writing {}/{STATE_FILE}",
                self.run_dir(info.run_id).display()
            )
        })
    }

    /// Reads every run; runs that had not ended were cut off by a daemon exit and are marked
    /// FAILED (and saved so). A folder whose state cannot be read comes back as a FAILED run
    /// visible to root only, so its id stays taken and cleanup removes it in time.
    pub fn load_all(&self) -> Loaded {
        let mut loaded = Loaded {
            runs: Vec::new(),
            next_id: 1,
        };
        let entries = match rfs::Dir::read_from(&self.runs) {
            Ok(d) => d,
            Err(e) => {
                log::warn!("reading {}/runs: {e}", self.root.display());
                return loaded;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let Some(id) = parse_run_id(&name) else {
                log::warn!(
                    "ignoring {}/runs/{name}: not a run folder",
                    self.root.display()
                );
                continue;
            };
            loaded.next_id = loaded.next_id.max(id.saturating_add(1));
            match self.load_run(id) {
                Ok(info) => loaded.runs.push(info),
                Err(e) => {
                    log::warn!("run {id}: {e:#}");
                    let info = unreadable_run(id);
                    let _ = self.save(&info);
                    loaded.runs.push(info);
                }
            }
        }
        loaded.runs.sort_by_key(|r| r.run_id);
        loaded
    }

    fn load_run(&self, id: u64) -> Result<RunInfo> {
        let dir = rfs::openat(
            &self.runs,
            id.to_string().as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .context("not a directory")?;
        let stat = rfs::fstat(&dir)?;
        // Earlier versions gave run folders to their owners, who could then plant links,
        // FIFOs or forged state in them: take the folder back, drop whatever is not a plain
        // file, and believe only the folder's owner, not what run.json says.
        let former_owner =
            (stat.st_uid != rustix::process::geteuid().as_raw()).then_some(stat.st_uid);
        if former_owner.is_some() || stat.st_mode & 0o022 != 0 {
            rfs::fchown(&dir, Some(rustix::process::geteuid()), None)?;
            rfs::fchmod(&dir, Mode::from_raw_mode(DIR_MODE))?;
            remove_non_regular(&dir);
        }
        let mut info: RunInfo = {
            let mut file = open_regular(&dir, STATE_FILE)?;
            let mut bytes = Vec::new();
            Read::by_ref(&mut file)
                .take(MAX_STATE_BYTES)
                .read_to_end(&mut bytes)?;
            serde_json::from_slice(&bytes).context("unreadable run.json")?
        };
        if info.run_id != id {
            log::warn!(
                "run {id}: run.json names run {}; the folder decides",
                info.run_id
            );
            info.run_id = id;
        }
        if let Some(owner) = former_owner {
            if info.owner_uid != owner {
                log::warn!(
                    "run {id}: run.json names owner {}, its folder belonged to {owner}",
                    info.owner_uid
                );
            }
            info.owner_uid = owner;
        }
        if !info.state.is_final() {
            info.state = RunState::Failed;
            info.reason = Some("the daemon stopped while the run was in flight".into());
            info.ended_unix_ms = Some(now_ms());
            if let Err(e) = self.save(&info) {
                log::warn!("saving run {id}: {e:#}");
            }
        }
        Ok(info)
    }

    /// Deletes the ended runs beyond the count and age limits; returns the deleted ids.
    pub fn cleanup(&self, runs: &[RunInfo]) -> Vec<u64> {
        let mut ended: Vec<&RunInfo> = runs.iter().filter(|r| r.state.is_final()).collect();
        ended.sort_by_key(|r| std::cmp::Reverse(r.run_id));
        let cutoff = now_ms().saturating_sub(self.keep_age.as_millis() as u64);
        let mut deleted = Vec::new();
        let mut per_owner: std::collections::HashMap<u32, usize> = Default::default();
        let mut kept = 0;
        for run in ended.iter() {
            let too_old = run.ended_unix_ms.unwrap_or(run.created_unix_ms) < cutoff;
            let owned = per_owner.entry(run.owner_uid).or_default();
            let over_owner = run.owner_uid != 0 && *owned >= self.keep_runs_per_user;
            if kept >= self.keep_runs || over_owner || too_old {
                if let Err(e) = self.delete(run.run_id) {
                    log::warn!("deleting run {}: {e:#}", run.run_id);
                } else {
                    deleted.push(run.run_id);
                }
            } else {
                *owned += 1;
                kept += 1;
            }
        }
        deleted
    }

    /// Deletes the folder of run `id` and everything in it.
    pub fn delete(&self, id: u64) -> Result<()> {
        // std's remove_dir_all works through directory fds and never follows links.
        std::fs::remove_dir_all(self.run_dir(id))?;
        Ok(())
    }
}

/// A run folder name: a decimal id the daemon could have made.
fn parse_run_id(name: &str) -> Option<u64> {
    if name.is_empty() || name.len() > 19 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok().filter(|&id| id > 0)
}

fn ensure_plain_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        bail!("{name:?} is not a file name");
    }
    Ok(())
}

/// The state of a run whose folder exists but whose `run.json` could not be read.
fn unreadable_run(id: u64) -> RunInfo {
    RunInfo {
        run_id: id,
        state: RunState::Failed,
        reason: Some("its state file was missing or unreadable".into()),
        samples: 0,
        pid: 0,
        pid_ns: 0,
        comm: String::new(),
        owner_uid: 0,
        sample_tags: Vec::new(),
        tags: Default::default(),
        created_unix_ms: now_ms(),
        ended_unix_ms: Some(now_ms()),
        files: Default::default(),
        top: Vec::new(),
        summary: None,
    }
}

/// Opens directory `path` under `at` without following a link, and makes sure it belongs to
/// the daemon and only the daemon can write it.
fn open_own_dir<Fd: AsFd>(at: Fd, path: impl rustix::path::Arg) -> Result<OwnedFd> {
    let dir = rfs::openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rfs::fstat(&dir)?;
    let me = rustix::process::geteuid();
    if stat.st_uid != me.as_raw() {
        rfs::fchown(&dir, Some(me), None)?;
    }
    if stat.st_mode & 0o7777 != DIR_MODE {
        rfs::fchmod(&dir, Mode::from_raw_mode(DIR_MODE))?;
    }
    Ok(dir)
}

/// Creates `name` under `dir`: new, never through a link, private.
fn create_new(dir: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    trusted_dir::create_new(dir, name, FILE_MODE).map(OwnedFd::from)
}

/// Opens `name` under `dir` for reading if it is a regular file (see
/// [`trusted_dir::open_regular`]).
fn open_regular(dir: &OwnedFd, name: &str) -> Result<File> {
    trusted_dir::open_regular(dir, name).with_context(|| format!("opening {name}"))
}

/// Removes every entry of `dir` that is not a regular file (links, FIFOs, sockets, devices,
/// folders): the daemon never creates any.
fn remove_non_regular(dir: &OwnedFd) {
    let Ok(entries) = rfs::Dir::read_from(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let Ok(stat) = rfs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        if rfs::FileType::from_raw_mode(stat.st_mode) != rfs::FileType::RegularFile {
            log::warn!("removing {name}: the daemon never creates anything but files");
            let flags = if rfs::FileType::from_raw_mode(stat.st_mode) == rfs::FileType::Directory {
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            let _ = rfs::unlinkat(dir, name.as_str(), flags);
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, state: RunState, ended: Option<u64>) -> RunInfo {
        RunInfo {
            run_id: id,
            state,
            reason: None,
            samples: 0,
            pid: 1,
            pid_ns: 1,
            comm: "x".into(),
            owner_uid: 0,
            sample_tags: vec![],
            tags: Default::default(),
            created_unix_ms: now_ms(),
            ended_unix_ms: ended,
            files: Default::default(),
            top: vec![],
            summary: None,
        }
    }

    #[test]
    fn in_flight_runs_come_back_failed_and_old_runs_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 2, 2, Duration::from_secs(3600)).unwrap();
        for (id, state) in [
            (1, RunState::Success),
            (2, RunState::Success),
            (3, RunState::Running),
            (4, RunState::Stopped),
        ] {
            store.create_run_dir(id).unwrap();
            store.save(&info(id, state, Some(now_ms()))).unwrap();
        }
        let loaded = store.load_all();
        assert_eq!(loaded.runs.len(), 4);
        assert_eq!(loaded.next_id, 5);
        let run3 = loaded.runs.iter().find(|r| r.run_id == 3).unwrap();
        assert_eq!(run3.state, RunState::Failed);
        assert!(run3.reason.as_deref().unwrap().contains("daemon"));
        // Keep 2 of the 4 ended runs: the newest (4 and 3).
        let deleted = store.cleanup(&loaded.runs);
        assert_eq!(deleted, vec![2, 1]);
        assert!(!store.run_dir(1).exists());
        assert!(store.run_dir(4).exists());
    }

    #[test]
    fn planted_links_and_fifos_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 10, 10, Duration::from_secs(3600)).unwrap();
        store.create_run_dir(7).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let run = store.run_dir(7);
        std::os::unix::fs::symlink(&victim, run.join("profile.svg")).unwrap();
        std::os::unix::fs::symlink(&victim, run.join(STATE_TMP)).unwrap();
        rustix::fs::mknodat(
            rfs::CWD,
            run.join(STATE_FILE).as_path(),
            rfs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // A result file replaces the link itself; the link's target is untouched.
        let (mut file, path) = store.create_result(7, "profile.svg", 0).unwrap();
        file.write_all(b"<svg/>").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_file());
        // A FIFO as run.json neither blocks loading nor is read; the run stays known.
        let loaded = store.load_all();
        assert_eq!(loaded.runs.len(), 1);
        assert_eq!(loaded.runs[0].state, RunState::Failed);
        assert_eq!(loaded.next_id, 8);
        // Saving goes through a fresh temporary file, not through the planted link.
        store
            .save(&info(7, RunState::Success, Some(now_ms())))
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(store.open_result(7, STATE_FILE).is_ok());
        assert!(store.open_result(7, "../victim").is_err());
    }

    #[test]
    fn run_ids_come_from_folder_names() {
        assert_eq!(parse_run_id("17"), Some(17));
        for bad in ["", "0", "-1", "1a", "18446744073709551616", "+3", " 4"] {
            assert_eq!(parse_run_id(bad), None, "{bad:?}");
        }
    }
}
