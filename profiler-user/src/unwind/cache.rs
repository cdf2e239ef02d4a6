//! Unwind tables kept on disk between bpfprof processes, so that a process whose objects
//! were seen before gets their tables in the time it takes to read them: libtorch_cpu.so's
//! table (2.6 million rows) costs half a second to seconds of a build thread, which every
//! new PyTorch process, every short command-line run and every daemon restart paid again.
//!
//! A table is filed under the hash of everything it is made from ([`CfiInputs::key`]: the
//! object's call frame information, the addresses it is read at, the row limit) and of the
//! bpfprof executable that built it, never under a path, a file identity or a build id that
//! a rebuilt object could keep: a rebuilt binary at the same path, with any change to its
//! unwind information, misses the cache and is built afresh. Entries are checked when read
//! (length, key, checksum, sorted rows); one that fails is removed and the table built.
//!
//! The folder is the running user's own (created 0700; a folder that another user owns or
//! that others may write, or one reached through such a folder or another user's link, is
//! refused, and the run goes on without a cache: see [`crate::trusted_dir`]), every entry is
//! reached through the open folder, never by path, entries are written whole and renamed into
//! place, and the least recently used are removed once the folder holds more than its cap.

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{anyhow, Context};
use profiler_common::UnwindRow;

use crate::trusted_dir::{DirError, TrustedDir};

use super::table::{CfiInputs, UnwindTable, MAX_TABLE_ROWS};

/// Bytes before an entry's payload: magic, key, unit count, checksum of the payload.
const HEADER: usize = 8 + 32 + 8 + 32;
/// Bytes of one encoded row: `pc`, `cfa_offset`, `info`, little-endian.
const ROW_BYTES: usize = 8;
/// Most bytes of any other entry's payload (the kernel's symbols: 3-4 MiB).
const MAX_BLOB_BYTES: usize = 64 << 20;

/// What an entry holds: its first bytes (and the format's version), its file names' end,
/// the bytes of one unit of its payload and the most units it may hold.
struct Kind {
    magic: &'static [u8; 8],
    suffix: &'static str,
    unit: usize,
    max_units: usize,
}

/// An unwind table's entry: its rows.
const TABLE: Kind = Kind {
    magic: b"BPFUNW01",
    suffix: ".rows",
    unit: ROW_BYTES,
    max_units: MAX_TABLE_ROWS,
};

/// Any other entry ([`TableCache::put_bytes`]): bytes its reader checks.
const BLOB: Kind = Kind {
    magic: b"BPFBLB01",
    suffix: ".blob",
    unit: 1,
    max_units: MAX_BLOB_BYTES,
};

/// Whether a file of the folder is an entry (of any kind).
fn is_entry(name: &str) -> bool {
    [TABLE.suffix, BLOB.suffix]
        .iter()
        .any(|s| name.ends_with(s))
}
/// Age past which a half-written entry (its writer exited) is removed.
const STALE_WRITE: std::time::Duration = std::time::Duration::from_secs(600);

/// The cache in one folder.
pub struct TableCache {
    dir: TrustedDir,
    /// The building executable's identity, part of every key.
    salt: Vec<u8>,
    /// Most bytes of entries kept.
    max_bytes: u64,
    /// What the folder held at this process's last trim plus what it wrote since, and the
    /// entries written since (see [`TRIM_EVERY`]); `None` before the first trim.
    trimmed: std::sync::Mutex<Option<(u64, u32)>>,
}

/// A cache trims its folder (lists and `stat`s every entry) at its first write, when its
/// own writes since the last trim would take the folder past its cap, and after this many
/// writes (other processes, the daemon and an agent, write to the same folder). Trimming at
/// every write, with 1,500 entries in the folder, was 7% of an agent's CPU on a machine
/// where builds kept starting new objects.
const TRIM_EVERY: u32 = 64;

impl TableCache {
    /// Opens (creating it where missing) the cache in `dir`, holding at most `max_bytes`;
    /// an error says why it cannot be used (the run then builds every table).
    pub fn open(dir: &Path, max_bytes: u64) -> anyhow::Result<TableCache> {
        Ok(TableCache {
            dir: TrustedDir::open(dir, Some(0o700))?,
            salt: own_identity()?,
            max_bytes,
            trimmed: std::sync::Mutex::new(None),
        })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The key under which the table of `inputs` is filed.
    pub fn key(&self, inputs: &CfiInputs<'_>) -> [u8; 32] {
        inputs.key(&self.salt)
    }

    /// The key under which anything else made from `inputs` is filed ([`Self::put_bytes`]),
    /// with this executable's identity, as a table's.
    pub fn key_of(&self, inputs: &[u8]) -> [u8; 32] {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update(b"bpfprof cache entry\0");
        hasher.update(&self.salt);
        hasher.update(inputs);
        hasher.finalize().into()
    }

    #[cfg(test)]
    fn path(&self, key: &[u8; 32]) -> PathBuf {
        self.path_of(key, &TABLE)
    }

    fn path_of(&self, key: &[u8; 32], kind: &Kind) -> PathBuf {
        self.dir.path().join(name_of(key, kind))
    }

    /// The table filed under `key`, if a sound entry holds it.
    pub fn get(&self, key: &[u8; 32]) -> Option<UnwindTable> {
        self.read(key, &TABLE, |file| {
            read_entry(file, key, &TABLE).and_then(decode_table)
        })
    }

    /// What `decode` makes of the bytes filed under `key` by [`Self::put_bytes`], if a sound
    /// entry holds them and `decode` takes them (an entry it refuses is removed). The bytes
    /// are a read-only mapping of the entry: pages its reader does not touch (again) are not
    /// this process's memory.
    pub fn get_bytes<T>(
        &self,
        key: &[u8; 32],
        decode: impl FnOnce(memmap2::Mmap) -> anyhow::Result<T>,
    ) -> Option<T> {
        self.read(key, &BLOB, |file| {
            map_entry(file, key, &BLOB).and_then(decode)
        })
    }

    /// Files `bytes` under `key`, as [`Self::put`] files a table.
    pub fn put_bytes(&self, key: &[u8; 32], bytes: &[u8]) {
        self.store_as(key, &entry_of(&BLOB, key, bytes, bytes.len()), &BLOB);
    }

    fn read<T>(
        &self,
        key: &[u8; 32],
        kind: &Kind,
        load: impl FnOnce(&mut File) -> anyhow::Result<T>,
    ) -> Option<T> {
        let (name, path) = (name_of(key, kind), self.path_of(key, kind));
        let mut file = match self.dir.open_regular(&name) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                log::debug!("unwind table cache: {}: {e}", path.display());
                return None;
            }
        };
        match load(&mut file) {
            Ok(table) => {
                // Recently used: kept longest when the folder is trimmed.
                let _ = file.set_modified(SystemTime::now());
                Some(table)
            }
            Err(e) => {
                log::warn!(
                    "unwind table cache: removing {}: {e:#}; it is made again",
                    path.display()
                );
                let _ = self.dir.remove(&name);
                None
            }
        }
    }

    /// Files `table` under `key` (written whole, then renamed into place), then trims the
    /// folder to its cap; a failure is logged and changes nothing else.
    pub fn put(&self, key: &[u8; 32], table: &UnwindTable) {
        self.store(key, &Self::entry(key, table));
    }

    /// The bytes of `table`'s entry under `key`, for [`Self::store`]: a build thread makes
    /// them while it holds the table, hands the table on, then stores them.
    pub fn entry(key: &[u8; 32], table: &UnwindTable) -> Vec<u8> {
        entry_of(&TABLE, key, &encode(&table.rows), table.rows.len())
    }

    /// Writes an entry made by [`Self::entry`], then trims the folder to its cap; a failure
    /// is logged and changes nothing else.
    pub fn store(&self, key: &[u8; 32], entry: &[u8]) {
        self.store_as(key, entry, &TABLE);
    }

    fn store_as(&self, key: &[u8; 32], entry: &[u8], kind: &Kind) {
        if let Err(e) = self.write(&name_of(key, kind), entry) {
            log::warn!("unwind table cache: not kept: {e:#}");
            return;
        }
        {
            let mut trimmed = self.trimmed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((total, writes)) = trimmed.as_mut() {
                *total += entry.len() as u64;
                *writes += 1;
                if *total <= self.max_bytes && *writes < TRIM_EVERY {
                    return;
                }
            }
        }
        if let Err(e) = self.trim() {
            log::warn!(
                "unwind table cache: trimming {}: {e:#}",
                self.dir.path().display()
            );
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let tmp = format!(".{name}.{tid}.tmp");
        self.dir
            .write_whole(name, &tmp, bytes, 0o600, false)
            .map_err(|e| anyhow!(e).context(format!("writing {}", self.path_of_name(&tmp))))
    }

    fn path_of_name(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Removes the least recently used entries while the folder holds more than its cap.
    fn trim(&self) -> std::io::Result<()> {
        let mut entries = Vec::new();
        let mut total = 0u64;
        for (name, stat) in self.dir.entries()? {
            if !rustix::fs::FileType::from_raw_mode(stat.st_mode).is_file() {
                continue;
            }
            let modified = modified(&stat);
            // A write that a process's exit cut short: gone once no writer can still be at it.
            if name.ends_with(".tmp")
                && modified.elapsed().ok().is_some_and(|age| age > STALE_WRITE)
            {
                let _ = self.dir.remove(&name);
                continue;
            }
            if !is_entry(&name) {
                continue;
            }
            let len = stat.st_size as u64;
            total += len;
            entries.push((modified, len, name));
        }
        if total > self.max_bytes {
            entries.sort();
            for (_, len, name) in entries {
                if total <= self.max_bytes {
                    break;
                }
                if self.dir.remove(&name).is_ok() {
                    total -= len;
                }
            }
        }
        *self.trimmed.lock().unwrap_or_else(|p| p.into_inner()) = Some((total, 0));
        Ok(())
    }
}

/// The file name of `key`'s entry of `kind`.
fn name_of(key: &[u8; 32], kind: &Kind) -> String {
    format!("{}{}", hex(key), kind.suffix)
}

/// When a file was last changed, from its status.
fn modified(stat: &rustix::fs::Stat) -> SystemTime {
    let since = std::time::Duration::new(
        stat.st_mtime.max(0) as u64,
        stat.st_mtime_nsec.clamp(0, 999_999_999) as u32,
    );
    SystemTime::UNIX_EPOCH + since
}

/// The symbolizer keeps the kernel's names here (see [`crate::symbolize::kernel`]).
impl crate::symbolize::EntryStore for TableCache {
    fn key_of(&self, inputs: &[u8]) -> [u8; 32] {
        TableCache::key_of(self, inputs)
    }

    fn get(
        &self,
        key: &[u8; 32],
        check: &dyn Fn(&[u8]) -> anyhow::Result<()>,
    ) -> Option<memmap2::Mmap> {
        self.get_bytes(key, |map| check(&map).map(|()| map))
    }

    fn put(&self, key: &[u8; 32], bytes: &[u8]) {
        self.put_bytes(key, bytes);
    }
}

/// Removes every entry of the cache in `dir` (and the folder, once empty): how many files
/// and bytes went; a missing folder is an empty cache.
pub fn clean(dir: &Path) -> std::io::Result<(usize, u64)> {
    // Deleted as root: through the folder, opened as the cache opens it.
    let folder = match TrustedDir::open(dir, None) {
        Ok(folder) => folder,
        Err(DirError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok((0, 0))
        }
        Err(DirError::Io { source, .. }) => return Err(source),
        Err(e @ DirError::Untrusted { .. }) => return Err(std::io::Error::other(e.to_string())),
    };
    let (mut files, mut bytes) = (0, 0);
    for (name, stat) in folder.entries()? {
        if !(is_entry(&name) || name.ends_with(".tmp")) {
            continue;
        }
        folder.remove(&name)?;
        files += 1;
        bytes += stat.st_size as u64;
    }
    let _ = std::fs::remove_dir(dir);
    Ok((files, bytes))
}

/// How many entries and bytes the cache in `dir` holds.
pub fn usage(dir: &Path) -> std::io::Result<(usize, u64)> {
    let mut usage = (0, 0);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if is_entry(&entry.file_name().to_string_lossy()) {
            usage.0 += 1;
            usage.1 += entry.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
    Ok(usage)
}

/// An entry of `kind` filed under `key` holding `count` units in `payload`.
fn entry_of(kind: &Kind, key: &[u8; 32], payload: &[u8], count: usize) -> Vec<u8> {
    use sha2::Digest;
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(kind.magic);
    bytes.extend_from_slice(key);
    bytes.extend_from_slice(&(count as u64).to_le_bytes());
    bytes.extend_from_slice(&sha2::Sha256::digest(payload));
    bytes.extend_from_slice(payload);
    bytes
}

/// Reads and checks one entry of `kind`: its length, magic, key and checksum; its payload.
fn read_entry(file: &mut File, key: &[u8; 32], kind: &Kind) -> anyhow::Result<Vec<u8>> {
    use sha2::Digest;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(anyhow!("not a regular file"));
    }
    let max = (HEADER + kind.max_units * kind.unit) as u64;
    if meta.len() < HEADER as u64 || meta.len() > max {
        return Err(anyhow!("{} bytes", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max).read_to_end(&mut bytes)?;
    if &bytes[..8] != kind.magic {
        return Err(anyhow!("not an entry of this format"));
    }
    if &bytes[8..40] != key {
        return Err(anyhow!("filed under another key"));
    }
    let count = u64::from_le_bytes(bytes[40..48].try_into().expect("8 bytes"));
    let payload = &bytes[HEADER..];
    if count.checked_mul(kind.unit as u64) != Some(payload.len() as u64) {
        return Err(anyhow!("{count} units in {} bytes", payload.len()));
    }
    if sha2::Sha256::digest(payload).as_slice() != &bytes[48..80] {
        return Err(anyhow!("checksum mismatch"));
    }
    bytes.drain(..HEADER);
    Ok(bytes)
}

/// Checks one entry of `kind` as [`read_entry`] does, and maps its payload (read-only, private)
/// instead of reading it.
fn map_entry(file: &mut File, key: &[u8; 32], kind: &Kind) -> anyhow::Result<memmap2::Mmap> {
    use sha2::Digest;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(anyhow!("not a regular file"));
    }
    let max = (HEADER + kind.max_units * kind.unit) as u64;
    if meta.len() <= HEADER as u64 || meta.len() > max {
        return Err(anyhow!("{} bytes", meta.len()));
    }
    let mut header = [0u8; HEADER];
    file.read_exact(&mut header)?;
    if &header[..8] != kind.magic {
        return Err(anyhow!("not an entry of this format"));
    }
    if &header[8..40] != key {
        return Err(anyhow!("filed under another key"));
    }
    let count = u64::from_le_bytes(header[40..48].try_into().expect("8 bytes"));
    let len = meta.len() - HEADER as u64;
    if count.checked_mul(kind.unit as u64) != Some(len) {
        return Err(anyhow!("{count} units in {len} bytes"));
    }
    // SAFETY: a private, read-only mapping of a file in this user's own folder (see
    // `TableCache::open`), whose entries are replaced by rename and never written in place.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(HEADER as u64)
            .len(len as usize)
            .map_copy_read_only(&*file)?
    };
    if sha2::Sha256::digest(&map[..]).as_slice() != &header[48..80] {
        return Err(anyhow!("checksum mismatch"));
    }
    Ok(map)
}

/// A table's payload, checked: its rows sorted with no two alike (what every built table is).
fn decode_table(rows: Vec<u8>) -> anyhow::Result<UnwindTable> {
    let rows: Vec<UnwindRow> = rows
        .chunks_exact(ROW_BYTES)
        .map(|r| UnwindRow {
            pc: u32::from_le_bytes([r[0], r[1], r[2], r[3]]),
            cfa_offset: u16::from_le_bytes([r[4], r[5]]),
            info: u16::from_le_bytes([r[6], r[7]]),
        })
        .collect();
    if rows.windows(2).any(|w| w[0].pc >= w[1].pc) {
        return Err(anyhow!("rows out of order"));
    }
    Ok(UnwindTable { rows })
}

fn encode(rows: &[UnwindRow]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(rows.len() * ROW_BYTES);
    for row in rows {
        bytes.extend_from_slice(&row.pc.to_le_bytes());
        bytes.extend_from_slice(&row.cfa_offset.to_le_bytes());
        bytes.extend_from_slice(&row.info.to_le_bytes());
    }
    bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The running executable's identity: its GNU build id, else the hash of its bytes; so that
/// a bpfprof whose table builder differs (a new version, a local build) never reads the
/// tables of another.
fn own_identity() -> anyhow::Result<Vec<u8>> {
    use sha2::Digest;
    let exe = File::open("/proc/self/exe").context("opening /proc/self/exe")?;
    let reader = crate::process::target_file::ElfReader::new(exe.try_clone()?);
    if let Some(id) = crate::process::target_file::gnu_build_id(&reader) {
        return Ok(id);
    }
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0; 1 << 16];
    loop {
        match (&exe).read(&mut buf).context("reading /proc/self/exe")? {
            0 => return Ok(hasher.finalize().to_vec()),
            n => hasher.update(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn table() -> UnwindTable {
        UnwindTable {
            rows: (0..100)
                .map(|i| UnwindRow {
                    pc: i * 16,
                    cfa_offset: 8 + (i % 3) as u16 * 8,
                    info: (i % 2) as u16,
                })
                .collect(),
        }
    }

    #[test]
    fn a_table_comes_back_as_it_was_filed_and_a_damaged_entry_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TableCache::open(&dir.path().join("unwind"), 1 << 20).unwrap();
        let key = [7u8; 32];
        assert!(cache.get(&key).is_none());
        cache.put(&key, &table());
        assert_eq!(cache.get(&key).unwrap(), table());
        assert!(cache.get(&[8u8; 32]).is_none(), "another key misses");

        // One flipped bit in a row: the checksum refuses it, and the entry goes.
        let path = cache.path(&key);
        let mut bytes = fs::read(&path).unwrap();
        bytes[HEADER + 5] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(cache.get(&key).is_none());
        assert!(!path.exists());

        // Truncated (a torn write of another program): refused too.
        cache.put(&key, &table());
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(cache.get(&key).is_none());

        // An entry copied under another key's name is not that key's table.
        cache.put(&key, &table());
        fs::copy(&path, cache.path(&[9u8; 32])).unwrap();
        assert!(cache.get(&[9u8; 32]).is_none());
    }

    #[test]
    fn bytes_come_back_under_their_key_only_and_an_entry_the_reader_refuses_goes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TableCache::open(&dir.path().join("unwind"), 1 << 20).unwrap();
        let key = cache.key_of(b"some inputs");
        assert_ne!(key, cache.key_of(b"other inputs"));
        cache.put_bytes(&key, b"payload");
        assert_eq!(&cache.get_bytes(&key, Ok).unwrap()[..], b"payload");
        // One flipped bit: refused and removed.
        let path = cache.path_of(&key, &BLOB);
        let mut bytes = fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(cache.get_bytes(&key, Ok).is_none());
        assert!(!path.exists());
        cache.put_bytes(&key, b"payload");
        // Not a table, whatever its key: a table's reader never sees the bytes.
        assert!(cache.get(&key).is_none());
        assert!(cache
            .get_bytes(&cache.key_of(b"other inputs"), Ok)
            .is_none());
        let refused = cache.get_bytes(&key, |_| -> anyhow::Result<()> { Err(anyhow!("no")) });
        assert!(refused.is_none());
        assert!(
            cache.get_bytes(&key, Ok).is_none(),
            "the refused entry was removed"
        );
        assert_eq!(usage(cache.dir()).unwrap(), (0, 0));
    }

    #[test]
    fn the_kernels_names_are_filed_once_and_mapped_back_the_same() {
        use crate::symbolize::{kernel::KernelSymbols, EntryStore};
        let dir = tempfile::tempdir().unwrap();
        let cache: std::sync::Arc<dyn EntryStore> =
            std::sync::Arc::new(TableCache::open(&dir.path().join("unwind"), 1 << 30).unwrap());
        let built = KernelSymbols::load(Some(&cache)).unwrap();
        assert!(!built.from_cache());
        assert_eq!(usage(&dir.path().join("unwind")).unwrap().0, 1);
        let mapped = KernelSymbols::load(Some(&cache)).unwrap();
        assert!(mapped.from_cache());
        assert_eq!(mapped.len(), built.len());
        // Read again after its pages were given back: the same names at every address tried.
        let listing = fs::read_to_string("/proc/kallsyms").unwrap();
        let addrs: Vec<u64> = listing
            .lines()
            .step_by(50)
            .filter_map(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
            .map(|a| a + 1)
            .collect();
        assert!(addrs.iter().any(|a| built.lookup(*a).is_some()));
        for addr in addrs {
            assert_eq!(mapped.lookup(addr), built.lookup(addr), "at {addr:#x}");
        }
    }

    #[test]
    fn a_folder_others_may_write_or_a_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = TableCache::open(&open, 1 << 20).err().unwrap();
        assert!(format!("{err:#}").contains("every user"), "{err:#}");
        // Below it too: a folder on the way that others may write is refused.
        let err = TableCache::open(&open.join("unwind"), 1 << 20)
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("every user"), "{err:#}");
        assert!(!open.join("unwind").exists());

        // A link this user made is followed, to a folder checked as any other.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let err = TableCache::open(&link, 1 << 20).err().unwrap();
        assert!(format!("{err:#}").contains("every user"), "{err:#}");

        // An entry that is a link (planted by whoever could write the folder) is not read.
        let cache = TableCache::open(&dir.path().join("ok"), 1 << 20).unwrap();
        let target = dir.path().join("elsewhere.rows");
        cache.put(&[1u8; 32], &table());
        fs::rename(cache.path(&[1u8; 32]), &target).unwrap();
        std::os::unix::fs::symlink(&target, cache.path(&[1u8; 32])).unwrap();
        assert!(cache.get(&[1u8; 32]).is_none());
    }

    #[test]
    fn the_least_recently_used_entries_go_first_when_the_folder_is_over_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let one = (HEADER + 100 * ROW_BYTES) as u64;
        let cache = TableCache::open(&dir.path().join("unwind"), 2 * one).unwrap();
        cache.put(&[1u8; 32], &table());
        cache.put(&[2u8; 32], &table());
        // Entry 1 read after entry 2 was written: entry 2 is now the least recently used.
        let old = SystemTime::now() - std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(cache.path(&[2u8; 32]))
            .unwrap()
            .set_modified(old)
            .unwrap();
        File::options()
            .write(true)
            .open(cache.path(&[1u8; 32]))
            .unwrap()
            .set_modified(old - std::time::Duration::from_secs(60))
            .unwrap();
        assert!(cache.get(&[1u8; 32]).is_some());
        cache.put(&[3u8; 32], &table());
        assert!(cache.path(&[1u8; 32]).exists());
        assert!(!cache.path(&[2u8; 32]).exists());
        assert!(cache.path(&[3u8; 32]).exists());
        assert_eq!(usage(cache.dir()).unwrap(), (2, 2 * one));
        assert_eq!(clean(cache.dir()).unwrap(), (2, 2 * one));
        assert!(!cache.dir().exists());
    }
}
