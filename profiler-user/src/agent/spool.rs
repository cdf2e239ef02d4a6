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

use std::{
    collections::VecDeque,
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::Mutex,
};

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
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
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

impl Spool {
    /// Opens (creating) the spool in `dir`, taking in the windows a previous run left there,
    /// removing half-written files.
    pub fn open(dir: &Path, limit: u64) -> std::io::Result<Spool> {
        use std::os::unix::fs::PermissionsExt;
        fs::create_dir_all(dir.join("rejected"))?;
        // Windows hold every process's stacks, names and paths: root's to read only.
        for d in [dir.to_path_buf(), dir.join("rejected")] {
            fs::set_permissions(d, fs::Permissions::from_mode(SPOOL_DIR_MODE))?;
        }
        let mut entries = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(TEMP_PREFIX) {
                let _ = fs::remove_file(entry.path());
                continue;
            }
            let Some(seq) = name
                .strip_suffix(&format!(".{EXTENSION}"))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let meta = entry.metadata()?;
            if meta.is_file() {
                entries.push(Entry {
                    seq,
                    bytes: meta.len(),
                });
            }
        }
        entries.sort_by_key(|e| e.seq);
        let next = entries.last().map_or(0, |e| e.seq + 1);
        let bytes = entries.iter().map(|e| e.bytes).sum();
        Ok(Spool {
            dir: dir.to_path_buf(),
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

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.{EXTENSION}"))
    }

    /// Writes a window (atomically: a temporary file, synced, renamed) as the newest, then
    /// drops the oldest windows past the limit. A window larger than the limit is dropped
    /// itself.
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
        let temp = self.dir.join(format!("{TEMP_PREFIX}{seq}"));
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(SPOOL_FILE_MODE)
                .open(&temp)?
        };
        file.write_all(body)?;
        file.sync_all()?;
        fs::rename(&temp, self.path(seq))?;
        // The rename is durable once the directory is synced.
        fs::File::open(&self.dir)?.sync_all()?;
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
            let _ = fs::remove_file(self.path(*seq));
        }
        Ok(Added {
            dropped: doomed.len() as u64,
        })
    }

    /// The oldest window and its body; `None` when the spool is empty. A file that cannot be
    /// read is dropped (counted by the caller as `Err`).
    pub fn oldest(&self) -> Option<(Entry, std::io::Result<Vec<u8>>)> {
        let entry = self.lock().entries.front().cloned()?;
        let body = fs::read(self.path(entry.seq));
        Some((entry, body))
    }

    /// Forgets `entry` (sent, or unreadable) and deletes its file.
    pub fn remove(&self, entry: &Entry) {
        self.forget(entry);
        let _ = fs::remove_file(self.path(entry.seq));
    }

    /// Moves `entry` to `rejected/`, keeping the newest [`REJECTED_KEPT`] there.
    pub fn reject(&self, entry: &Entry) {
        self.forget(entry);
        let rejected = self.dir.join("rejected");
        let _ = fs::rename(
            self.path(entry.seq),
            rejected.join(format!("{:020}.{EXTENSION}", entry.seq)),
        );
        let mut kept: Vec<PathBuf> = fs::read_dir(&rejected)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        kept.sort();
        let excess = kept.len().saturating_sub(REJECTED_KEPT);
        for path in &kept[..excess] {
            let _ = fs::remove_file(path);
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
}
