//! Room in the kernel's row array: where the resident tables lie, where a new one fits, and
//! which tables may be evicted for it.

use super::*;

impl UnwindMaps {
    /// The resident tables: (first row, rows).
    pub(super) fn resident(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.tables.values().filter_map(|t| match t.state {
            TableState::Resident { first_row, rows } => Some((first_row, rows)),
            _ => None,
        })
    }

    /// The first free range of `rows` rows, evicting tables sampled before `evict_before`
    /// (never-sampled ones first, then the longest unsampled) when `Some` and nothing is free.
    pub(super) fn allocate(&mut self, rows: u32, sampled_at: Option<Instant>) -> Option<u32> {
        loop {
            if let Some(at) = self.free_range(rows) {
                return Some(at);
            }
            let now = sampled_at?;
            let victim = self
                .tables
                .iter()
                .filter(|(_, t)| matches!(t.state, TableState::Resident { .. }))
                .filter(|(_, t)| evictable(t, now))
                .min_by_key(|(_, t)| t.last_sampled)
                .map(|(k, _)| k.clone())?;
            let TableState::Resident {
                rows: victim_rows, ..
            } = self.tables[&victim].state
            else {
                return None;
            };
            log::info!(
                "evicting the unwind table of {} ({victim_rows} rows) for a sampled object",
                self.tables[&victim].name
            );
            // The kernel forgets the rows before they are reused.
            self.decide(&victim, TableState::Evicted { rows: victim_rows });
            self.evictions += 1;
        }
    }

    /// Whether `rows` rows fit now, or would once unsampled tables are evicted.
    pub(super) fn can_make_room(&self, rows: u32, now: Instant) -> bool {
        if self.free_range(rows).is_some() {
            return true;
        }
        let evictable: u64 = self
            .tables
            .values()
            .filter(|t| evictable(t, now))
            .filter_map(|t| match t.state {
                TableState::Resident { rows, .. } => Some(u64::from(rows)),
                _ => None,
            })
            .sum();
        let used: u64 = self.resident().map(|(_, r)| u64::from(r)).sum();
        u64::from(self.capacity) - used + evictable >= u64::from(rows)
    }

    /// The first gap of `rows` free rows in the array.
    pub(super) fn free_range(&self, rows: u32) -> Option<u32> {
        let mut taken: Vec<(u32, u32)> = self.resident().collect();
        taken.sort_unstable();
        let mut at = 0u32;
        for (first, len) in taken {
            if first.saturating_sub(at) >= rows {
                return Some(at);
            }
            at = at.max(first + len);
        }
        (self.capacity.saturating_sub(at) >= rows).then_some(at)
    }
}

/// Whether a resident table may be evicted for one sampled at `now`: it was not sampled in the
/// last [`RECENTLY_SAMPLED`].
fn evictable(table: &Table, now: Instant) -> bool {
    table
        .last_sampled
        .is_none_or(|t| now.saturating_duration_since(t) >= RECENTLY_SAMPLED)
}
