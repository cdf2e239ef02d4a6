//! Fair shares of naming Python frames between the users a daemon serves (issue 23).
//!
//! Naming a frame reads its code object, name, file and line table out of the target's
//! memory, and keeps what it read: work and memory the target's user decides the size of (a
//! process may run hundreds of thousands of code objects, with names and files of thousands
//! of characters). As the table builder shares its threads by owner (see
//! `unwind::builder`), naming is shared by owner too: each owner (the user a run is for; root
//! and the command line count as one) may keep [`NAMING_BYTES_PER_OWNER`] of names over all
//! its runs and processes, and use [`NAMING_CPU_PER_PERIOD`] of CPU per [`NAMING_PERIOD`] over
//! all its runs. Frames past a share wait for the next period (they stay queued in their
//! run), or, past the bytes, stay unnamed and are counted in the run's summary.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Bytes of names (functions, files, line ranges) one owner's runs may keep at once, all its
/// processes together: a PyTorch training run's few thousand code objects keep a few MiB.
/// Kept per process (64 MiB each), six processes of one run (a run follows its children)
/// took a daemon to 971 MiB; 64 MiB per owner still left it at 241 MiB (what is counted
/// leaves out allocation overheads and the reads' buffers), past the 200 MB bound.
pub const NAMING_BYTES_PER_OWNER: u64 = 32 << 20;

/// CPU one owner's naming may use per [`NAMING_PERIOD`] in a daemon, all its runs together:
/// a tenth of a core, so that one user's costly frames leave the daemon's other work (every
/// other user's ticks and clients) the rest; naming a few thousand ordinary code objects
/// takes a few milliseconds.
pub const NAMING_CPU_PER_PERIOD: Duration = Duration::from_millis(50);

/// The period over which [`NAMING_CPU_PER_PERIOD`] is counted: a tick that refreshes a run's
/// processes comes this often (`recording::MAPS_REFRESH`).
pub const NAMING_PERIOD: Duration = Duration::from_millis(500);

/// The extra CPU a run may spend naming the frames still queued when it ends, beyond its
/// owner's share of the period: its last samples are named while its processes may still
/// live.
pub const NAMING_CPU_AT_END: Duration = Duration::from_millis(200);

/// Whose naming a share is: the uid of the run's owner.
pub type Owner = u32;

/// What one owner used.
#[derive(Debug, Default)]
struct OwnerShare {
    /// Bytes its runs keep for named frames.
    kept: u64,
    /// When its current period began.
    period: Option<Instant>,
    /// CPU given to its naming in the current period.
    cpu: Duration,
}

/// The naming shares of every owner of one daemon (or of one command-line run or agent,
/// which have one owner).
#[derive(Debug)]
pub struct NamingShares {
    owners: Mutex<HashMap<Owner, OwnerShare>>,
    /// CPU per owner per period; `None` for a single-owner recording (the command line, the
    /// agent), whose naming shares the process with nobody.
    cpu_per_period: Option<Duration>,
}

impl NamingShares {
    /// Shares for a daemon: CPU and memory per owner.
    pub fn per_owner() -> NamingShares {
        NamingShares {
            owners: Mutex::new(HashMap::new()),
            cpu_per_period: Some(NAMING_CPU_PER_PERIOD),
        }
    }

    /// Shares for one owner alone (the command line, the agent): memory is bounded, CPU not.
    pub fn single() -> NamingShares {
        NamingShares {
            owners: Mutex::new(HashMap::new()),
            cpu_per_period: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, OwnerShare>> {
        // Plain counters: a panic while holding the lock leaves them usable.
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `owner` keeps less than [`NAMING_BYTES_PER_OWNER`]: a frame is named only then
    /// (so the share is passed by one code object at most).
    pub fn has_room(&self, owner: Owner) -> bool {
        self.kept(owner) < NAMING_BYTES_PER_OWNER
    }

    /// Records that `owner` keeps `bytes` more.
    pub fn charge(&self, owner: Owner, bytes: u64) {
        let mut owners = self.lock();
        let share = owners.entry(owner).or_default();
        share.kept = share.kept.saturating_add(bytes);
    }

    /// Records that `owner` no longer keeps `bytes` (a run ended).
    pub fn release(&self, owner: Owner, bytes: u64) {
        let mut owners = self.lock();
        if let Some(share) = owners.get_mut(&owner) {
            share.kept = share.kept.saturating_sub(bytes);
        }
    }

    /// Takes what is left of `owner`'s CPU for this period, at most `want` (`at_end`: at
    /// least [`NAMING_CPU_AT_END`] more): the caller names for that long, then gives back
    /// what it did not use with [`Self::give_back`]. Unbounded (`want`) for a single owner.
    pub fn take_cpu(&self, owner: Owner, want: Duration, at_end: bool) -> Duration {
        let Some(per_period) = self.cpu_per_period else {
            return want;
        };
        let mut owners = self.lock();
        let share = owners.entry(owner).or_default();
        let now = Instant::now();
        if share
            .period
            .is_none_or(|p| now.duration_since(p) >= NAMING_PERIOD)
        {
            share.period = Some(now);
            share.cpu = Duration::ZERO;
        }
        let mut left = per_period.saturating_sub(share.cpu);
        if at_end {
            left += NAMING_CPU_AT_END;
        }
        let given = left.min(want);
        share.cpu += given;
        given
    }

    /// Gives back CPU taken with [`Self::take_cpu`] and not used.
    pub fn give_back(&self, owner: Owner, unused: Duration) {
        if self.cpu_per_period.is_none() {
            return;
        }
        let mut owners = self.lock();
        if let Some(share) = owners.get_mut(&owner) {
            share.cpu = share.cpu.saturating_sub(unused);
        }
    }

    /// Bytes `owner`'s runs keep now.
    pub fn kept(&self, owner: Owner) -> u64 {
        self.lock().get(&owner).map_or(0, |s| s.kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_keeps_its_bytes_apart_from_another_and_gets_them_back() {
        let shares = NamingShares::per_owner();
        shares.charge(1000, NAMING_BYTES_PER_OWNER - 10);
        assert!(shares.has_room(1000));
        shares.charge(1000, 20);
        assert!(!shares.has_room(1000), "past its share");
        // Another owner's share is whole.
        assert!(shares.has_room(2000));
        shares.release(1000, 100);
        assert_eq!(shares.kept(1000), NAMING_BYTES_PER_OWNER - 90);
        assert!(shares.has_room(1000));
    }

    #[test]
    fn an_owners_runs_share_one_cpu_slice_per_period() {
        let shares = NamingShares::per_owner();
        let want = Duration::from_secs(1);
        // Two runs of one owner: the second gets what the first left.
        assert_eq!(shares.take_cpu(1000, want, false), NAMING_CPU_PER_PERIOD);
        assert_eq!(shares.take_cpu(1000, want, false), Duration::ZERO);
        // Another owner is not charged for it.
        assert_eq!(shares.take_cpu(2000, want, false), NAMING_CPU_PER_PERIOD);
        // Unused CPU comes back; a run's end gets its extra.
        shares.give_back(1000, Duration::from_millis(20));
        assert_eq!(
            shares.take_cpu(1000, want, false),
            Duration::from_millis(20)
        );
        assert_eq!(shares.take_cpu(1000, want, true), NAMING_CPU_AT_END);
        // A single owner's CPU is not bounded.
        let single = NamingShares::single();
        assert_eq!(single.take_cpu(0, want, false), want);
    }
}
