//! The budget that bounds the sealed copies of targets' files (issue 41): a file its user
//! could truncate is read from a copy in a sealed memory file ([`super::target_file::stable`]),
//! whose pages count in no process's RSS and stay while anything holds the copy. One budget
//! per driver (the agent's recording, each daemon user's runs, a command line run) is handed
//! to every [`super::maps::ProcessMaps`] it captures: copies of one object (same device,
//! inode, size and modification time) are shared by every process mapping it, each is
//! dropped (and its bytes given back to the budget) when nothing holds it any more, and a
//! copy that would pass the budget is not made: the object is then named
//! `module+0xOFFSET`, the reason logged once per object.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, Weak,
    },
};

use crate::process::maps::FileId;

/// The agent's default budget, in MiB: with the agent's own memory (about 100 MiB) it stays
/// well inside the shipped unit's `MemoryMax=512M`.
pub const DEFAULT_AGENT_COPY_MIB: u64 = 128;
/// The daemon's default budget per user, in MiB (each user's runs share one).
pub const DEFAULT_DAEMON_COPY_MIB: u64 = 128;
/// The budget of a command line run, in MiB: its user copies the files of its own targets,
/// which it could read anyway.
pub const DEFAULT_RECORD_COPY_MIB: u64 = 1024;

/// Objects whose refusal is remembered (to say it once): past this, the set starts afresh.
const REMEMBERED_REFUSALS: usize = 4096;

/// Why no copy was made of an object.
pub const EXHAUSTED: &str = "copy budget exhausted";

/// A budget for sealed copies; cloning it gives another handle on the same budget.
#[derive(Clone, Debug)]
pub struct CopyBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: u64,
    /// Bytes of the copies alive (their sizes).
    used: AtomicU64,
    /// Objects refused so far, counted once each.
    refusals: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Each object's copy while something holds it, by identity, with the copy's serial.
    copies: HashMap<CopyKey, (u64, Weak<SealedCopy>)>,
    next_serial: u64,
    /// Objects refused (said once each).
    refused: HashSet<CopyKey>,
    /// Other warnings said, by what they are about (see [`CopyBudget::first_time`]).
    said: HashSet<String>,
}

/// What makes two opens of an object the same object: device, inode, size and modification
/// time (a file rewritten in place is another).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct CopyKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl From<&FileId> for CopyKey {
    fn from(id: &FileId) -> CopyKey {
        CopyKey {
            dev: id.dev,
            ino: id.ino,
            size: id.size,
            mtime_ns: id.mtime_ns,
        }
    }
}

/// One object's sealed copy, counted against its budget until the last holder drops it.
#[derive(Debug)]
pub struct SealedCopy {
    /// The sealed memory file.
    pub file: File,
    size: u64,
    key: CopyKey,
    serial: u64,
    budget: Arc<Inner>,
}

impl Drop for SealedCopy {
    fn drop(&mut self) {
        let mut state = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        if state
            .copies
            .get(&self.key)
            .is_some_and(|(serial, _)| *serial == self.serial)
        {
            state.copies.remove(&self.key);
        }
        self.budget.used.fetch_sub(self.size, Ordering::Relaxed);
    }
}

impl CopyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> CopyBudget {
        CopyBudget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicU64::new(0),
                refusals: AtomicU64::new(0),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// A budget of `mib` MiB.
    pub fn mib(mib: u64) -> CopyBudget {
        CopyBudget::new(mib.saturating_mul(1 << 20))
    }

    /// Whether anything besides this handle holds the budget (another handle, a copy).
    pub fn shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// Its limit in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Bytes of the copies alive now.
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Objects refused a copy so far (each counted once).
    pub fn refusals(&self) -> u64 {
        self.inner.refusals.load(Ordering::Relaxed)
    }

    /// Whether a warning about `what` is said for the first time in this driver's life (a
    /// warning repeated at every maps refresh was logged 64 times in 15 s): the budget is the
    /// one handle every capture of the driver holds.
    pub fn first_time(&self, what: &str) -> bool {
        let mut state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.said.contains(what) {
            return false;
        }
        if state.said.len() >= REMEMBERED_REFUSALS {
            state.said.clear();
        }
        state.said.insert(what.to_string())
    }

    /// The copy of the object `id` describes: the one alive if some process's maps hold it,
    /// else a new one made by `make` (which copies the object into a sealed memory file) if
    /// its size fits in what is left of the budget. `Err(None)` when the budget refused it
    /// and said so before (the caller says nothing); `Err(Some(reason))` the first time, or
    /// when `make` failed.
    pub fn copy(
        &self,
        id: &FileId,
        make: impl FnOnce() -> std::io::Result<File>,
    ) -> Result<Arc<SealedCopy>, Option<String>> {
        let key = CopyKey::from(id);
        // Held while the copy is made: two holders of one object never copy it twice.
        let mut state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(copy) = state.copies.get(&key).and_then(|(_, weak)| weak.upgrade()) {
            return Ok(copy);
        }
        let used = self.used();
        if used.saturating_add(id.size) > self.inner.limit {
            if state.refused.len() >= REMEMBERED_REFUSALS {
                state.refused.clear();
            }
            if !state.refused.insert(key) {
                return Err(None);
            }
            self.inner.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(Some(format!(
                "{EXHAUSTED} ({} MiB of {} MiB held by copies of other objects, this one is \
                 {} MiB)",
                used >> 20,
                self.inner.limit >> 20,
                id.size.div_ceil(1 << 20)
            )));
        }
        let file = make().map_err(|e| Some(e.to_string()))?;
        self.inner.used.fetch_add(id.size, Ordering::Relaxed);
        let serial = state.next_serial;
        state.next_serial += 1;
        let copy = Arc::new(SealedCopy {
            file,
            size: id.size,
            key,
            serial,
            budget: Arc::clone(&self.inner),
        });
        state.copies.insert(key, (serial, Arc::downgrade(&copy)));
        Ok(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64, size: u64) -> FileId {
        FileId {
            dev: 1,
            ino,
            size,
            mtime_ns: 0,
            uid: 1000,
        }
    }

    fn memfd() -> std::io::Result<File> {
        Ok(rustix::fs::memfd_create("test", rustix::fs::MemfdFlags::CLOEXEC)?.into())
    }

    #[test]
    fn copies_are_shared_bounded_and_given_back() {
        let budget = CopyBudget::new(100);
        let a = budget.copy(&id(1, 60), memfd).unwrap();
        // The same object again: the same copy, nothing more counted, nothing copied.
        let again = budget.copy(&id(1, 60), || panic!("copied twice")).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(budget.used(), 60);
        // Another object past the budget: refused, said once.
        let said = budget.copy(&id(2, 50), memfd).unwrap_err();
        assert!(said.unwrap().contains(EXHAUSTED));
        assert_eq!(budget.copy(&id(2, 50), memfd).unwrap_err(), None);
        assert_eq!(budget.refusals(), 1);
        // Once no process holds the first, its bytes are given back.
        drop((a, again));
        assert_eq!(budget.used(), 0);
        let b = budget.copy(&id(2, 50), memfd).unwrap();
        assert_eq!(budget.used(), 50);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
