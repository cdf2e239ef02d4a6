//! The running kernel's own function names (its core text, `_stext` to `_etext`), read from
//! `/proc/kallsyms` once per boot and kept on disk beside the unwind tables.
//!
//! Reading `/proc/kallsyms` costs 40 ms of kernel CPU (the kernel formats 120k lines for each
//! reader), and blazesym kept the parsed symbols in about 7 MiB: that was two thirds of what a
//! short command-line run spent naming its stacks, on the CPUs its target was using. The core
//! kernel's text does not move while the machine is up, so a table filed under the boot's id
//! stays right until the next boot. Everything else in the kernel's address space (modules,
//! BPF programs, trampolines) loads and unloads at any time: an address outside the core text
//! is not answered here and goes to blazesym, which reads `/proc/kallsyms` afresh.

use std::{io::BufRead, sync::Arc};

use super::EntryStore;

/// Where blazesym looks for the running kernel's `vmlinux` (with its DWARF, it names inlined
/// kernel functions and source lines): where one exists, blazesym names every kernel frame.
const VMLINUX_DIRS: [&str; 2] = ["/boot", "/usr/lib/debug/boot"];

/// Most symbols a table may hold (a kernel has 100-200k function symbols).
const MAX_SYMBOLS: usize = 4_000_000;

/// Function names of the core kernel text, sorted by address, kept as the bytes of its
/// cache entry (mapped, checked, and used as they are: once checked, only the pages that
/// lookups touch are the process's memory; 3.8 MB read into memory were a tenth of a run's
/// peak).
///
/// The bytes: `_stext`'s address (u64), the text's length (u64), the symbol count (u32),
/// then each symbol's offset from `_stext` (u32, strictly increasing), where each name ends
/// in the names (u32), and the names one after the other (UTF-8); little-endian.
#[derive(Debug)]
pub struct KernelSymbols {
    bytes: Bytes,
    /// Symbols in the table.
    count: usize,
}

/// Where a table's bytes are: built from `/proc/kallsyms`, or mapped from the cache.
#[derive(Debug)]
enum Bytes {
    Built(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Built(bytes) => bytes,
            Bytes::Mapped(map) => map,
        }
    }
}

/// Bytes before the offsets: base, length, count.
const FIXED: usize = 20;

impl KernelSymbols {
    /// The table for this boot: from `cache` where it holds a sound one, else read from
    /// `/proc/kallsyms` (and filed in `cache`); `None` where a `vmlinux` gives blazesym more
    /// (inlined functions, lines) or the kernel shows no addresses.
    pub fn load(cache: Option<&Arc<dyn EntryStore>>) -> Option<KernelSymbols> {
        if vmlinux_exists() {
            return None;
        }
        let key = cache.and_then(|cache| Some((cache, cache.key_of(&boot_identity()?))));
        if let Some((cache, key)) = &key {
            let check = |bytes: &[u8]| Self::check(bytes).map(|_| ());
            if let Some(map) = cache.get(key, &check) {
                // Checked by `get`.
                let count = word(&map, 16) as usize;
                let symbols = KernelSymbols {
                    bytes: Bytes::Mapped(map),
                    count,
                };
                symbols.forget_pages();
                return Some(symbols);
            }
        }
        let file = std::fs::File::open("/proc/kallsyms").ok()?;
        let symbols = Self::parse(std::io::BufReader::new(file))?;
        if let Some((cache, key)) = key {
            cache.put(&key, &symbols.bytes);
        }
        Some(symbols)
    }

    /// The table of a `kallsyms` listing: its function symbols between `_stext` and
    /// `_etext`; `None` without those two, or with every address 0 (a reader the kernel
    /// hides addresses from).
    pub fn parse(reader: impl BufRead) -> Option<KernelSymbols> {
        let mut symbols: Vec<(u64, String)> = Vec::new();
        let (mut start, mut end) = (None, None);
        for line in reader.lines() {
            let line = line.ok()?;
            let mut fields = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            match name {
                "_stext" => start = Some(addr),
                "_etext" => end = Some(addr),
                _ => {}
            }
            // Module symbols name their module after the symbol: not core text.
            let function = matches!(kind, "t" | "T" | "w" | "W");
            if function && addr != 0 && fields.next().is_none() {
                symbols.push((addr, name.to_string()));
            }
        }
        let (base, end) = (start?, end?);
        if base == 0 || end <= base || end - base > u64::from(u32::MAX) {
            return None;
        }
        symbols.retain(|(addr, _)| (base..end).contains(addr));
        // Aliases at one address (`__x64_sys_x` and `__do_sys_x`): the first listed names it.
        symbols.sort_by_key(|(addr, _)| *addr);
        symbols.dedup_by_key(|(addr, _)| *addr);
        let names_len: usize = symbols.iter().map(|(_, name)| name.len()).sum();
        u32::try_from(names_len).ok()?;
        let mut bytes = Vec::with_capacity(FIXED + symbols.len() * 8 + names_len);
        bytes.extend_from_slice(&base.to_le_bytes());
        bytes.extend_from_slice(&(end - base).to_le_bytes());
        bytes.extend_from_slice(&(symbols.len() as u32).to_le_bytes());
        for (addr, _) in &symbols {
            bytes.extend_from_slice(&((addr - base) as u32).to_le_bytes());
        }
        let mut name_end = 0u32;
        for (_, name) in &symbols {
            name_end += name.len() as u32;
            bytes.extend_from_slice(&name_end.to_le_bytes());
        }
        for (_, name) in &symbols {
            bytes.extend_from_slice(name.as_bytes());
        }
        Some(KernelSymbols {
            bytes: Bytes::Built(bytes),
            count: symbols.len(),
        })
    }

    /// The name of the function at `addr`, where `addr` is in the core kernel text and a
    /// symbol at or below it is known.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        self.find(addr).map(|(_, name)| name)
    }

    /// The address and name of the function at `addr` ([`Self::lookup`]).
    fn find(&self, addr: u64) -> Option<(u64, &str)> {
        let offset = addr
            .checked_sub(self.base())
            .filter(|o| *o < self.text_len())? as u32;
        // The last symbol at or below `offset` (offsets are strictly increasing).
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let mid = (low + high) / 2;
            if self.offset(mid) <= offset {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let index = low.checked_sub(1)?;
        let start = match index {
            0 => 0,
            i => self.name_end(i - 1),
        };
        let names = &self.bytes[FIXED + self.count * 8..];
        let name = std::str::from_utf8(names.get(start..self.name_end(index))?).ok()?;
        Some((self.base() + u64::from(self.offset(index)), name))
    }

    /// Whether the table was mapped from a cache entry (rather than read from the kernel).
    pub fn from_cache(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    /// How many symbols the table holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the table holds no symbol.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn base(&self) -> u64 {
        u64::from_le_bytes(self.bytes[0..8].try_into().expect("8 bytes"))
    }

    fn text_len(&self) -> u64 {
        u64::from_le_bytes(self.bytes[8..16].try_into().expect("8 bytes"))
    }

    fn offset(&self, index: usize) -> u32 {
        word(&self.bytes, FIXED + index * 4)
    }

    fn name_end(&self, index: usize) -> usize {
        word(&self.bytes, FIXED + self.count * 4 + index * 4) as usize
    }

    /// Gives back the pages of a mapped table that checking it or looking names up touched:
    /// the file's pages stay in the page cache, and a lookup maps back the few it reads. (The
    /// kernel maps the cached pages around each one read, 64 KiB by default: a few hundred
    /// lookups had mapped the whole table, 3.7 MiB of a run's peak RSS.)
    pub fn forget_pages(&self) {
        if let Bytes::Mapped(map) = &self.bytes {
            // SAFETY: a private read-only file mapping that nothing wrote: its pages are read
            // again from the file, which is never written in place (see `TableCache`).
            let dropped = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
            if let Err(e) = dropped {
                log::debug!("kernel symbols: madvise: {e}");
            }
        }
    }

    /// A cache entry's payload, checked whole: offsets increasing and inside the text, name
    /// ends in order and ending with the names, which are UTF-8 and cut between characters.
    #[cfg(test)]
    fn decode(bytes: Bytes) -> anyhow::Result<KernelSymbols> {
        let count = Self::check(&bytes)?;
        Ok(KernelSymbols { bytes, count })
    }

    /// Checks a table's bytes whole (see [`Self::decode`]): its symbol count.
    fn check(bytes: &[u8]) -> anyhow::Result<usize> {
        use anyhow::ensure;
        ensure!(bytes.len() >= FIXED, "cut short");
        let count = word(bytes, 16) as usize;
        ensure!(count <= MAX_SYMBOLS, "{count} symbols");
        ensure!(bytes.len() >= FIXED + count * 8, "cut short");
        let offset = |i: usize| word(bytes, FIXED + i * 4);
        let name_end = |i: usize| word(bytes, FIXED + count * 4 + i * 4) as usize;
        let text_len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let names = std::str::from_utf8(&bytes[FIXED + count * 8..])?;
        ensure!(text_len <= u64::from(u32::MAX), "text too long");
        ensure!(
            (1..count).all(|i| offset(i - 1) < offset(i)),
            "symbols out of order"
        );
        ensure!(
            count == 0 || u64::from(offset(count - 1)) < text_len,
            "a symbol past the text"
        );
        ensure!(
            (1..count).all(|i| name_end(i - 1) <= name_end(i))
                && (count == 0 || name_end(count - 1) == names.len()),
            "names out of bounds"
        );
        ensure!(
            (0..count).all(|i| names.is_char_boundary(name_end(i))),
            "a name cut inside a character"
        );
        Ok(count)
    }
}

/// The little-endian u32 at `at` of `bytes` (in bounds: checked by the caller).
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// Whether blazesym finds a `vmlinux` of the running kernel (see [`VMLINUX_DIRS`]).
fn vmlinux_exists() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let file = format!("vmlinux-{}", release.trim());
    VMLINUX_DIRS
        .iter()
        .any(|dir| std::path::Path::new(dir).join(&file).exists())
}

/// What names this boot of this kernel: its boot id and release, and the table's format.
fn boot_identity() -> Option<Vec<u8>> {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let release = std::fs::read("/proc/sys/kernel/osrelease").ok()?;
    Some([b"kernel symbols v1\0".as_slice(), &boot, b"\0", &release].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
0000000000000000 A fixed_percpu_data
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81000000 T _text
ffffffff81000100 t helper
ffffffff81000200 T do_work
ffffffff81000300 D some_data
ffffffff81000400 T _etext
ffffffff81000400 T after_text
ffffffffc0000000 t mod_fn\t[some_mod]
";

    #[test]
    fn core_text_is_named_and_nothing_outside_it() {
        let table = KernelSymbols::parse(LISTING.as_bytes()).unwrap();
        assert_eq!(table.lookup(0xffffffff81000000), Some("_stext"));
        assert_eq!(table.lookup(0xffffffff81000150), Some("helper"));
        assert_eq!(table.lookup(0xffffffff810003ff), Some("do_work"));
        // Past _etext, a module, below the text: blazesym's to answer.
        assert_eq!(table.lookup(0xffffffff81000400), None);
        assert_eq!(table.lookup(0xffffffffc0000010), None);
        assert_eq!(table.lookup(0xffffffff80ffffff), None);
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn hidden_addresses_give_no_table() {
        let hidden = LISTING
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect::<String>();
        assert!(KernelSymbols::parse(hidden.as_bytes()).is_none());
        assert!(KernelSymbols::parse("".as_bytes()).is_none());
    }

    #[test]
    fn an_entry_reads_back_whole_and_a_damaged_one_is_refused() {
        let table = KernelSymbols::parse(LISTING.as_bytes()).unwrap();
        let bytes = table.bytes.to_vec();
        let decode = |bytes: Vec<u8>| KernelSymbols::decode(Bytes::Built(bytes));
        let back = decode(bytes.clone()).unwrap();
        assert_eq!((&*back.bytes, back.count), (&*table.bytes, table.count));
        for cut in [0, 19, 20, bytes.len() - 1] {
            assert!(decode(bytes[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        // Two offsets swapped.
        let mut swapped = bytes.clone();
        swapped[20..28].rotate_left(4);
        assert!(decode(swapped).is_err());
        // A name end past the names.
        let mut long = bytes.clone();
        let last_end = 20 + 3 * 4 + 2 * 4;
        long[last_end..last_end + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(long).is_err());
        // A name cut inside a character: "helper" made "h\u{e9}lper" with its end moved in.
        let mut listing = LISTING.replace("helper", "h\u{e9}lper");
        listing.push('\n');
        let accented = KernelSymbols::parse(listing.as_bytes()).unwrap();
        let mut cut = accented.bytes.to_vec();
        let first_end = 20 + 3 * 4;
        let end = u32::from_le_bytes(cut[first_end..first_end + 4].try_into().unwrap());
        assert_eq!(end, "_stext".len() as u32);
        let second_end = first_end + 4;
        cut[second_end..second_end + 4].copy_from_slice(&(end + 2).to_le_bytes());
        assert!(decode(cut).is_err());
    }

    #[test]
    fn the_running_kernel_names_its_own_functions() {
        let file = std::fs::File::open("/proc/kallsyms").unwrap();
        let table = KernelSymbols::parse(std::io::BufReader::new(file)).unwrap();
        assert!(table.len() > 10_000, "{} symbols", table.len());
        let listing = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let schedule = listing
            .lines()
            .find(|l| l.ends_with(" T schedule"))
            .and_then(|l| u64::from_str_radix(&l[..16], 16).ok())
            .unwrap();
        assert_eq!(table.lookup(schedule + 1), Some("schedule"));
    }

    #[test]
    fn names_agree_with_blazesym_reading_kallsyms() {
        use blazesym::symbolize::{source, Input, Symbolizer};
        let file = std::fs::File::open("/proc/kallsyms").unwrap();
        let table = KernelSymbols::parse(std::io::BufReader::new(file)).unwrap();
        // Where aliases share an address, either may name it: what is compared is the
        // address of the symbol each side chose.
        // Inside every 97th function: its second byte, its middle and its last byte.
        let mut addrs = Vec::new();
        for i in (0..table.len() - 1).step_by(97) {
            let (here, next) = (table.offset(i) as u64, table.offset(i + 1) as u64);
            if next - here >= 2 {
                addrs.extend([here + 1, (here + next) / 2, next - 1].map(|o| table.base() + o));
            }
        }
        let blazesym = Symbolizer::builder().enable_demangling(false).build();
        let source = source::Source::Kernel(source::Kernel {
            vmlinux: blazesym::MaybeDefault::None,
            ..Default::default()
        });
        let theirs = blazesym.symbolize(&source, Input::AbsAddr(&addrs)).unwrap();
        let mut compared = 0;
        for (addr, theirs) in addrs.iter().zip(theirs) {
            let Some(sym) = theirs.as_sym() else { continue };
            let (start, ours) = table.find(*addr).unwrap();
            assert_eq!(
                start, sym.addr,
                "at {addr:#x}: {ours} against blazesym's {}",
                sym.name
            );
            compared += 1;
        }
        assert!(
            compared * 10 >= addrs.len() * 9,
            "{compared} of {}",
            addrs.len()
        );
    }
}
