//! Tables for code a JIT generated in anonymous memory, which has no `.eh_frame`: a runtime
//! that knows its code's frames (HotSpot's code cache, see `crate::runtime::hotspot`) writes
//! their rows for one address range of a process, and writes them again when its code
//! changes. Each version is a table of its own ([`FileKey::Jit`]): the kernel is pointed at
//! the new rows before the old ones are freed, so that no walk reads rows being rewritten.

use super::*;

/// The JIT range and current table of each process that has one.
#[derive(Default)]
pub(super) struct JitTables {
    by_pid: StdHashMap<u32, JitTable>,
    /// The last generation given out.
    generation: u64,
}

struct JitTable {
    start: u64,
    end: u64,
    key: FileKey,
}

impl UnwindMaps {
    /// Gives the kernel `rows` for process `pid`'s JIT code in `[start, end)`: rows' pcs are
    /// offsets from `start`, sorted. Every executable anonymous mapping of the process within
    /// the range is walked by them (from the next read of its maps on, and now). Returns
    /// whether the rows are resident (a full row array leaves the range to the walk's
    /// fallbacks).
    pub fn set_jit_table(
        &mut self,
        pid: u32,
        (start, end): (u64, u64),
        rows: Vec<UnwindRow>,
    ) -> bool {
        self.jit.generation += 1;
        let key = FileKey::Jit {
            pid,
            generation: self.jit.generation,
        };
        self.new_table(key.clone(), "[jit code]");
        // A JIT's table is always wanted: its code is what the process runs.
        if let Some(table) = self.tables.get_mut(&key) {
            table.last_sampled = Some(Instant::now());
        }
        self.install(Built {
            key: key.clone(),
            table: Ok(UnwindTable { rows }),
            took: Duration::ZERO,
            cpu: Duration::ZERO,
            boosted: false,
            cached: false,
        });
        let resident = matches!(
            self.tables.get(&key).map(|t| &t.state),
            Some(TableState::Resident { .. })
        );
        let old = self.jit.by_pid.insert(
            pid,
            JitTable {
                start,
                end,
                key: key.clone(),
            },
        );
        if let Some(tracked) = self.tracked.get_mut(&pid) {
            for m in tracked
                .mappings
                .iter_mut()
                .filter(|m| start <= m.start && m.end <= end && m.source.is_none())
            {
                m.key = Some(key.clone());
                m.bias = start;
            }
        }
        if let Err(e) = self.write_process(pid) {
            log::debug!("pid {pid}: {e:#}");
        }
        // The kernel reads the new rows now: the old ones may go.
        if let Some(old) = old {
            self.tables.remove(&old.key);
        }
        resident
    }

    /// The mapping of an anonymous executable `[start, end)` of `pid` that lies in its JIT
    /// range.
    pub(super) fn jit_mapping(&self, pid: u32, start: u64, end: u64) -> Option<TrackedMapping> {
        let jit = self.jit.by_pid.get(&pid)?;
        (jit.start <= start && end <= jit.end).then(|| TrackedMapping {
            start,
            end,
            bias: jit.start,
            key: Some(jit.key.clone()),
            source: None,
        })
    }

    /// Drops `pid`'s JIT table (the process is no longer walked).
    pub(super) fn forget_jit_table(&mut self, pid: u32) {
        if let Some(old) = self.jit.by_pid.remove(&pid) {
            self.tables.remove(&old.key);
        }
    }
}
