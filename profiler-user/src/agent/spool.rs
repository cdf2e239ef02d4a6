//! The exporter's on-disk spool: every window to export is a file here until the backend
//! took it, so that nothing sampled is lost while the backend is away, nor across a
//! `kill -9` or a reboot of the agent.
//!
//! Each window is one file, `SEQ.pb` (the encoded request; SEQ 20 digits, increasing across
//! restarts), written to a temporary name, synced and renamed, so a file present is whole.
//! Files are sent oldest first, one at a time, and deleted once taken: in order, and once
//! (a crash between the backend's answer and the delete sends that one window again). The
//! spool holds at most its byte limit: the oldest windows are dropped first, each counted.
//! A window the backend refused for good (4xx) is moved to `rejected/`, of which the newest
//! [`REJECTED_KEPT`] are kept for a person to look at.

use std::{collections::VecDeque, io::Read, path::Path, sync::Mutex};

use crate::trusted_dir::{DirError, TrustedDir};

/// Refused windows kept in `rejected/`, newest: enough to see why, bounded.
pub const REJECTED_KEPT: usize = 16;
/// The spool folders' mode: what the windows show is root's to see (as the agent's HTTP
/// server, which serves the same, should listen on loopback).
const SPOOL_DIR_MODE: u32 = 0o700;
/// A spooled window's file's mode.
const SPOOL_FILE_MODE: u32 = 0o600;
/// A spooled window's file extension.
const EXTENSION: &str = "pb";
/// The prefix of a file being written (removed at start if a crash left it).
const TEMP_PREFIX: &str = ".tmp-";

/// One spooled window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its sequence number: the order windows were cut in.
    pub seq: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The spool: a directory of windows, oldest first, within a byte limit.
///
/// The spool's folder and every folder on its path are checked when it is opened (see
/// [`crate::trusted_dir`]): a state directory that another user could write in is refused,
/// since the spool is written as root. Every file is then reached through the open folder.
#[derive(Debug)]
pub struct Spool {
    dir: TrustedDir,
    rejected: TrustedDir,
    limit: u64,
    /// The windows on disk, oldest first, and the next sequence number; the lock is held
    /// only to read or change this list, never for file I/O.
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    entries: VecDeque<Entry>,
    next: u64,
    bytes: u64,
}

/// What adding a window did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Added {
    /// Windows dropped (oldest first) to keep within the limit.
    pub dropped: u64,
}

/// A window's file name.
fn file_name(seq: u64) -> String {
    format!("{seq:020}.{EXTENSION}")
}

impl Spool {
    /// Opens (creating) the spool in `dir`, taking in the windows a previous run left there,
    /// removing half-written files. A folder on the way that another user owns or may write
    /// is refused ([`DirError::Untrusted`]).
    pub fn open(dir: &Path, limit: u64) -> Result<Spool, DirError> {
        // Windows hold every process's stacks, names and paths: root's to read only.
        let dir = TrustedDir::open(dir, Some(SPOOL_DIR_MODE))?;
        let rejected = dir.subdir("rejected", Some(SPOOL_DIR_MODE))?;
        let io = |e| DirError::Io {
            path: dir.path().to_path_buf(),
            source: e,
        };
        let mut entries = Vec::new();
        for (name, stat) in dir.entries().map_err(io)? {
            if name.starts_with(TEMP_PREFIX) {
                let _ = dir.remove(&name);
                continue;
            }
            let Some(seq) = name
                .strip_suffix(&format!(".{EXTENSION}"))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            if rustix::fs::FileType::from_raw_mode(stat.st_mode).is_file() {
                entries.push(Entry {
                    seq,
                    bytes: stat.st_size as u64,
                });
            }
        }
        entries.sort_by_key(|e| e.seq);
        let next = entries.last().map_or(0, |e| e.seq + 1);
        let bytes = entries.iter().map(|e| e.bytes).sum();
        Ok(Spool {
            dir,
            rejected,
            limit,
            state: Mutex::new(State {
                entries: entries.into(),
                next,
                bytes,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes a window (atomically: a new temporary file, synced, renamed) as the newest,
    /// then drops the oldest windows past the limit. A window larger than the limit is
    /// dropped itself.
    pub fn add(&self, body: &[u8]) -> std::io::Result<Added> {
        let seq = {
            let mut state = self.lock();
            state.next += 1;
            state.next - 1
        };
        let bytes = body.len() as u64;
        if bytes > self.limit {
            return Ok(Added { dropped: 1 });
        }
        self.dir.write_whole(
            &file_name(seq),
            &format!("{TEMP_PREFIX}{seq}"),
            body,
            SPOOL_FILE_MODE,
            true,
        )?;
        let mut doomed = Vec::new();
        {
            let mut state = self.lock();
            // Entries are kept in sequence order: a slower writer of an older window is
            // placed before newer ones.
            let at = state.entries.partition_point(|e| e.seq < seq);
            state.entries.insert(at, Entry { seq, bytes });
            state.bytes += bytes;
            while state.bytes > self.limit {
                let Some(oldest) = state.entries.pop_front() else {
                    break;
                };
                state.bytes -= oldest.bytes;
                doomed.push(oldest.seq);
            }
        }
        for seq in &doomed {
            let _ = self.dir.remove(&file_name(*seq));
        }
        Ok(Added {
            dropped: doomed.len() as u64,
        })
    }

    /// The oldest window and its body; `None` when the spool is empty. A file that cannot be
    /// read is dropped (counted by the caller as `Err`).
    pub fn oldest(&self) -> Option<(Entry, std::io::Result<Vec<u8>>)> {
        let entry = self.lock().entries.front().cloned()?;
        let body = self
            .dir
            .open_regular(&file_name(entry.seq))
            .and_then(|mut file| {
                let mut body = Vec::with_capacity(entry.bytes as usize);
                file.read_to_end(&mut body)?;
                Ok(body)
            });
        Some((entry, body))
    }

    /// Forgets `entry` (sent, or unreadable) and deletes its file.
    pub fn remove(&self, entry: &Entry) {
        self.forget(entry);
        let _ = self.dir.remove(&file_name(entry.seq));
    }

    /// Moves `entry` to `rejected/`, keeping the newest [`REJECTED_KEPT`] there.
    pub fn reject(&self, entry: &Entry) {
        self.forget(entry);
        let name = file_name(entry.seq);
        let _ = self.dir.rename_to(&name, &self.rejected, &name);
        let mut kept: Vec<String> = self
            .rejected
            .entries()
            .into_iter()
            .flatten()
            .map(|(name, _)| name)
            .collect();
        kept.sort();
        let excess = kept.len().saturating_sub(REJECTED_KEPT);
        for name in &kept[..excess] {
            let _ = self.rejected.remove(name);
        }
    }

    fn forget(&self, entry: &Entry) {
        let mut state = self.lock();
        if let Some(at) = state.entries.iter().position(|e| e.seq == entry.seq) {
            state.entries.remove(at);
            state.bytes -= entry.bytes;
        }
    }

    /// Windows and bytes spooled now.
    pub fn size(&self) -> (usize, u64) {
        let state = self.lock();
        (state.entries.len(), state.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, path::PathBuf};

    impl Spool {
        fn path(&self, seq: u64) -> PathBuf {
            self.dir.path().join(file_name(seq))
        }
    }

    #[test]
    fn windows_come_out_in_order_survive_a_reopen_and_stay_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 100).unwrap();
        for i in 0..3u8 {
            assert_eq!(spool.add(&[i; 30]).unwrap(), Added { dropped: 0 });
        }
        // A half-written file of a crash is removed on open.
        fs::write(dir.path().join(format!("{TEMP_PREFIX}9")), b"partial").unwrap();
        drop(spool);
        let spool = Spool::open(dir.path(), 100).unwrap();
        assert!(!dir.path().join(format!("{TEMP_PREFIX}9")).exists());
        assert_eq!(spool.size(), (3, 90));
        // The fourth pushes the oldest out.
        assert_eq!(spool.add(&[3; 30]).unwrap(), Added { dropped: 1 });
        assert_eq!(spool.size(), (3, 90));
        let mut seen = Vec::new();
        while let Some((entry, body)) = spool.oldest() {
            seen.push(body.unwrap()[0]);
            spool.remove(&entry);
        }
        assert_eq!(seen, vec![1, 2, 3]);
        // Sequence numbers go on after a reopen, so order holds across restarts.
        spool.add(&[4; 10]).unwrap();
        drop(spool);
        let spool = Spool::open(dir.path(), 100).unwrap();
        spool.add(&[5; 10]).unwrap();
        let (first, _) = spool.oldest().unwrap();
        spool.remove(&first);
        assert_eq!(spool.oldest().unwrap().1.unwrap(), vec![5; 10]);
        // Too large for the limit: dropped at once.
        assert_eq!(spool.add(&[0; 101]).unwrap(), Added { dropped: 1 });
        // Root's alone to read.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dir.path()), SPOOL_DIR_MODE);
        assert_eq!(mode(&dir.path().join("rejected")), SPOOL_DIR_MODE);
        let (entry, _) = spool.oldest().unwrap();
        assert_eq!(mode(&spool.path(entry.seq)), SPOOL_FILE_MODE);
    }

    #[test]
    fn refused_windows_are_set_aside_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        for _ in 0..REJECTED_KEPT + 3 {
            spool.add(b"x").unwrap();
            let (entry, _) = spool.oldest().unwrap();
            spool.reject(&entry);
        }
        assert_eq!(spool.size(), (0, 0));
        let kept = fs::read_dir(dir.path().join("rejected")).unwrap().count();
        assert_eq!(kept, REJECTED_KEPT);
        assert!(dir
            .path()
            .join("rejected")
            .join(format!("{:020}.{EXTENSION}", REJECTED_KEPT + 2))
            .exists());
    }

    #[test]
    fn a_spool_another_user_could_write_in_is_refused_and_links_are_never_followed() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let base = tempfile::tempdir().unwrap();
        let victim = base.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        // A state directory every user may write in, or (as root) another user's.
        let open = base.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let refused = Spool::open(&open.join("spool/otlp"), 1 << 20).unwrap_err();
        assert!(
            matches!(&refused, DirError::Untrusted { path, .. } if *path == open),
            "{refused}"
        );
        if rustix::process::geteuid().is_root() {
            let theirs = base.path().join("theirs");
            fs::create_dir_all(theirs.join("otlp/rejected")).unwrap();
            for d in ["", "otlp", "otlp/rejected"] {
                std::os::unix::fs::chown(theirs.join(d), Some(65534), None).unwrap();
            }
            symlink(&victim, theirs.join("otlp/.tmp-0")).unwrap();
            let refused = Spool::open(&theirs.join("otlp"), 1 << 20).unwrap_err();
            assert!(
                matches!(&refused, DirError::Untrusted { path, reason }
                    if *path == theirs && reason.contains("uid 65534")),
                "{refused}"
            );
        }
        // Links in the spool's own folder (only root could have made them): a window's
        // temporary and final names are replaced, never written through.
        let dir = base.path().join("state/spool/otlp");
        let spool = Spool::open(&dir, 1 << 20).unwrap();
        for name in [format!("{TEMP_PREFIX}0"), file_name(0), file_name(1)] {
            symlink(&victim, dir.join(name)).unwrap();
        }
        spool.add(b"window").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(spool.oldest().unwrap().1.unwrap(), b"window");
        drop(spool);
        // Reopened, a link named as a window is not taken in.
        let spool = Spool::open(&dir, 1 << 20).unwrap();
        assert_eq!(spool.size(), (1, 6));
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
    }
}
