//! Tables' lives: sampled objects promoted or built again, jobs submitted to the build threads,
//! built tables installed into the row array, and what cannot be loaded decided once.

use super::*;

impl UnwindMaps {
    /// Notes that a target ran at these user addresses (a stack the kernel recorded): objects
    /// without a table are built first, and resident tables are kept over unsampled ones.
    pub fn note_sampled(&mut self, ips: impl IntoIterator<Item = u64>) {
        let now = Instant::now();
        let mut hit: Vec<(FileKey, Owner)> = Vec::new();
        for ip in ips {
            if ip == 0 || ip >= USER_ADDRESS_LIMIT {
                continue;
            }
            for tracked in self.tracked.values() {
                let at = tracked.mappings.partition_point(|m| m.start <= ip);
                let Some(m) = at.checked_sub(1).map(|i| &tracked.mappings[i]) else {
                    continue;
                };
                if ip < m.end {
                    if let Some(key) = &m.key {
                        let hit_by = (key.clone(), tracked.owner);
                        if !hit.contains(&hit_by) {
                            hit.push(hit_by);
                        }
                    }
                }
            }
        }
        for (key, owner) in hit {
            self.sampled(key, owner, now);
        }
    }

    /// An object `key` was sampled at `now` in a process of `owner`.
    pub(super) fn sampled(&mut self, key: FileKey, owner: Owner, now: Instant) {
        let Some(table) = self.tables.get_mut(&key) else {
            return;
        };
        table.last_sampled = Some(now);
        if !matches!(table.state, TableState::Resident { .. }) {
            table.sampled_untabled.get_or_insert(now);
        }
        let rows = match table.state {
            TableState::Queued => {
                if let Some(builder) = &self.builder {
                    builder.promote(&key, owner);
                }
                return;
            }
            TableState::NoRoom { rows } | TableState::Evicted { rows } => rows,
            TableState::OnDemand { estimated_rows } => estimated_rows,
            TableState::Resident { .. } | TableState::Unavailable { .. } => return,
        };
        // Built again only when it will fit: its size is known, so no build is wasted.
        if !self.can_make_room(rows, now) {
            let state = if rows > self.capacity {
                TableState::Unavailable {
                    why: format!(
                        "its table (about {} MiB) is larger than the unwind row array ({} MiB; \
                         --unwind-table-mib raises it)",
                        (u64::from(rows) * 8).div_ceil(1 << 20),
                        self.capacity_bytes() >> 20
                    ),
                }
            } else {
                TableState::NoRoom { rows }
            };
            self.decide(&key, state);
            return;
        }
        let source = self
            .tracked
            .values()
            .flat_map(|t| &t.mappings)
            .find(|m| m.key.as_ref() == Some(&key))
            .and_then(|m| m.source.clone());
        let Some((image, _)) =
            source.and_then(|s| crate::process::target_file::open_proc_link(&s).ok())
        else {
            return;
        };
        self.submit(key, Image::File(image), 0, owner, true);
    }

    pub(super) fn new_table(&mut self, key: FileKey, name: &str) {
        self.tables.insert(
            key,
            Table {
                state: TableState::Queued,
                name: name.to_string(),
                last_sampled: None,
                sampled_untabled: None,
                resident_since: None,
                warned: false,
            },
        );
    }

    /// Hands a table to the build threads (started on first use), in `owner`'s queue.
    pub(super) fn submit(
        &mut self,
        key: FileKey,
        image: Image,
        size: u64,
        owner: Owner,
        urgent: bool,
    ) {
        if self.builder.is_none() {
            match Builder::spawn(self.priority, self.cache.clone()) {
                Ok(builder) => self.builder = Some(builder),
                Err(e) => {
                    self.decide(
                        &key,
                        TableState::Unavailable {
                            why: format!("no thread to build tables: {e}"),
                        },
                    );
                    return;
                }
            }
        }
        if let Some(table) = self.tables.get_mut(&key) {
            table.state = TableState::Queued;
        }
        if let Some(builder) = &self.builder {
            builder.submit(Job { key, image, size }, owner, urgent);
        }
    }

    /// Puts a finished build in the row array, or notes why it is not there.
    pub(super) fn install(&mut self, built: Built) {
        let Built {
            key,
            table,
            took,
            cpu,
            boosted,
            cached,
        } = built;
        let Some(entry) = self.tables.get(&key) else {
            return;
        };
        let sampled = entry.last_sampled.is_some();
        let table = match table {
            Ok(table) => table,
            Err(e) => {
                self.decide(
                    &key,
                    TableState::Unavailable {
                        why: format!("{e:#}"),
                    },
                );
                return;
            }
        };
        self.built.0 += 1;
        self.built.1 += table.rows.len() as u64;
        self.built.2 += took;
        self.from_cache += usize::from(cached);
        let rows = table.rows.len() as u32;
        if table.rows.is_empty() {
            self.decide(
                &key,
                TableState::Unavailable {
                    why: "it has no call frame information".into(),
                },
            );
            return;
        }
        if table.rows.len() > MAX_ROWS_PER_TABLE as usize || rows > self.capacity {
            let why = format!(
                "its table ({} rows, {} MiB) is larger than {}",
                table.rows.len(),
                table.bytes() >> 20,
                if rows > self.capacity {
                    format!(
                        "the unwind row array ({} MiB; --unwind-table-mib raises it)",
                        self.capacity_bytes() >> 20
                    )
                } else {
                    format!("the walk can search ({MAX_ROWS_PER_TABLE} rows)")
                }
            );
            self.decide(&key, TableState::Unavailable { why });
            return;
        }
        // A table nobody sampled yet takes free room only; a sampled one may evict.
        let Some(first_row) = self.allocate(rows, sampled.then(Instant::now)) else {
            self.decide(&key, TableState::NoRoom { rows });
            return;
        };
        if let Err(e) = self.write_rows(first_row, &table.rows) {
            self.decide(
                &key,
                TableState::Unavailable {
                    why: format!("{e:#}"),
                },
            );
            return;
        }
        log::debug!(
            "unwind table for {}: {rows} rows in {} ms ({} ms of CPU{})",
            self.tables[&key].name,
            took.as_millis(),
            cpu.as_millis(),
            if boosted { ", boosted" } else { "" }
        );
        self.decide(&key, TableState::Resident { first_row, rows });
    }

    /// Writes `rows` into the row array from `first_row` on, through a mapping of just the
    /// pages they cover.
    pub(super) fn write_rows(&self, first_row: u32, rows: &[UnwindRow]) -> anyhow::Result<()> {
        let size = std::mem::size_of::<UnwindRow>();
        let at = first_row as usize * size;
        let bytes = std::mem::size_of_val(rows);
        let page = rustix::param::page_size();
        let window = at & !(page - 1);
        // SAFETY: the map was created with BPF_F_MMAPABLE and holds `capacity` rows, which
        // cover the window (`allocate` keeps tables inside it); the kernel program only reads.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(window as u64)
                .len(at + bytes - window)
                .map_mut(self.rows_map.fd().as_fd_raw())
        }
        .context("mapping the unwind row array")?;
        // SAFETY: UnwindRow is plain #[repr(C)] data without padding.
        let src = unsafe { std::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), bytes) };
        map[at - window..].copy_from_slice(src);
        Ok(())
    }

    /// Sets `key`'s state, tells the kernel, and warns once about an object left without a
    /// table for a reason the user can act on.
    pub(super) fn decide(&mut self, key: &FileKey, state: TableState) {
        let capacity_mib = self.capacity_bytes() >> 20;
        let Some(table) = self.tables.get_mut(key) else {
            return;
        };
        let warning = match &state {
            TableState::Unavailable { why }
                if why.contains("larger than")
                    || why.starts_with(crate::unwind::table::BUILD_LIMIT) =>
            {
                Some(why.clone())
            }
            TableState::NoRoom { rows } if table.last_sampled.is_some() => Some(format!(
                "the unwind row array ({capacity_mib} MiB) is full of tables sampled in the \
                 last {}s; its table needs {} MiB (--unwind-table-mib raises the array)",
                RECENTLY_SAMPLED.as_secs(),
                (u64::from(*rows) * 8) >> 20
            )),
            TableState::Unavailable { why } => {
                log::debug!("no unwind table for {}: {why}", table.name);
                None
            }
            _ => None,
        };
        if let Some(why) = warning {
            if !table.warned {
                table.warned = true;
                log::warn!("{} unwinds by frame pointer: {why}", table.name);
            }
        }
        if matches!(state, TableState::Resident { .. }) {
            table.resident_since = Some(Instant::now());
        } else if matches!(table.state, TableState::Resident { .. }) {
            table.sampled_untabled = None;
        }
        table.state = state;
        self.write_processes_of(key);
    }
}

/// Raw fd of a borrowed map fd, for mmap.
trait AsFdRaw {
    fn as_fd_raw(&self) -> std::os::fd::RawFd;
}

impl<T: std::os::fd::AsFd> AsFdRaw for T {
    fn as_fd_raw(&self) -> std::os::fd::RawFd {
        self.as_fd().as_raw_fd()
    }
}
