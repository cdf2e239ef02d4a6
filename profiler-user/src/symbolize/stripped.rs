//! Names for code that no symbol covers, as in stripped libraries (Debian's liblzma has only
//! its exported functions in `.dynsym`): without them every sampled address of one internal
//! function would be a row of its own (`liblzma.so.5+0x1692b`, `+0x16904`, ...).
//!
//! The unwind tables (`.eh_frame_hdr`) list where every function starts, stripped or not,
//! so an address is named by the start of its function (all samples of that internal function
//! share the name): `module+0xSTART` (its file offset), or `export+0x1a0` only where that
//! start lies inside the extent of the exported function before it (or the export has no
//! size to say where it ends). Code past an export's end is not that export's: Debian's
//! python3.14 showed its eval loop as `_PyObject_DebugMallocStats+0x10bb7`, 68 KB past the
//! end of a function of 414 bytes.
//!
//! One kind of code past every export's end still belongs to an export: the part GCC splits
//! off a function (`-freorder-blocks-and-partition`, `NAME.cold` in a symbol table) into
//! `.text.unlikely`, with an unwind entry of its own. Only the function's own branches lead
//! into the middle of it (a call or tail call lands on a function's first instruction), so
//! an unwind entry that an exported function's jumps enter past its start is that export's
//! part, named `export.cold` as the debug file names it. Debian's python3.14 keeps most of
//! `_PyEval_EvalFrameDefault` in such a part (84 KB; the exported entry is 1184 bytes), and
//! the Python frames take the place of the eval loop's frames by that name.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use gimli::{BaseAddresses, EhFrameHdr, Pointer, RunTimeEndian};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

/// Most bytes of exported code decoded to find split-off parts (see the module's notes): a
/// few milliseconds. Python's interpreter exports 400 KB of code; a library past this
/// (libtorch_cpu's exports are hundreds of MB) names such parts `module+0xSTART`.
const MAX_DECODED_BYTES: u64 = 16 << 20;

/// What a binary says about its functions' extents when its symbols do not.
#[derive(Debug, Default)]
pub struct FunctionStarts {
    /// Function entry points (ELF virtual addresses), sorted.
    starts: Vec<u64>,
    /// Exported functions (`.dynsym`): address, size (0: unknown) and name, sorted by address.
    exports: Vec<(u64, u64, String)>,
    /// Loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
    /// The file, read again on the first address past every export's end.
    path: Option<PathBuf>,
    /// Split-off parts by their start, with the index in `exports` of the function they are
    /// part of (found on first need).
    parts: OnceLock<HashMap<u64, usize>>,
}

impl FunctionStarts {
    /// Reads the unwind table, exports and segments of the ELF file at `path`; `None` when
    /// it is not an ELF file or has no unwind table.
    pub fn read(path: &Path) -> Option<FunctionStarts> {
        // Only the headers, `.eh_frame_hdr` and the dynamic symbols are touched.
        let mut starts = Self::parse(&crate::process::target_file::map_stable(path)?)?;
        starts.path = Some(path.to_path_buf());
        Some(starts)
    }

    /// [`FunctionStarts::read`] on the bytes of an ELF file already in memory (the fuzz
    /// target's entry): split-off parts are then found only by [`FunctionStarts::find_parts`].
    pub fn parse(data: &[u8]) -> Option<FunctionStarts> {
        let elf = object::File::parse(data).ok()?;
        let hdr = elf.section_by_name(".eh_frame_hdr")?;
        let endian = if elf.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let bases = BaseAddresses::default().set_eh_frame_hdr(hdr.address());
        let address_size = if elf.is_64() { 8 } else { 4 };
        let parsed = EhFrameHdr::new(hdr.data().ok()?, endian)
            .parse(&bases, address_size)
            .ok()?;
        let table = parsed.table()?;
        let mut entries = table.iter(&bases);
        let mut starts = Vec::new();
        while let Ok(Some((initial, _fde))) = entries.next() {
            if let Pointer::Direct(start) = initial {
                starts.push(start);
            }
        }
        starts.sort_unstable();
        starts.dedup();
        let mut exports: Vec<(u64, u64, String)> = elf
            .dynamic_symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
            // A nameless export (a hostile file's; found by the stripped_names fuzz target)
            // would name its code with nothing: the module and offset name it instead.
            .filter(|(_, _, name)| !name.is_empty())
            .collect();
        // Aliases share an address: keep one name for it, the shortest, then the first, with
        // the largest size any of them states.
        exports.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(a.2.len().cmp(&b.2.len()))
                .then(a.2.cmp(&b.2))
        });
        let mut merged: Vec<(u64, u64, String)> = Vec::with_capacity(exports.len());
        for export in exports {
            match merged.last_mut() {
                Some(last) if last.0 == export.0 => last.1 = last.1.max(export.1),
                _ => merged.push(export),
            }
        }
        let exports = merged;
        let segments = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        Some(FunctionStarts {
            starts,
            exports,
            segments,
            path: None,
            parts: OnceLock::new(),
        })
    }

    /// The name of the function holding file offset `offset` of this binary (`module` is
    /// its file name), when the unwind table knows where that function starts.
    pub fn name(&self, module: &str, offset: u64) -> Option<String> {
        let &(seg_offset, _, seg_address) = self
            .segments
            .iter()
            .find(|&&(start, size, _)| offset.checked_sub(start).is_some_and(|into| into < size))?;
        // The headers and symbols are the file's: sums past 2^64 name nothing, never panic.
        let address = (offset - seg_offset).checked_add(seg_address)?;
        let i = self.starts.partition_point(|&s| s <= address);
        let start = *self.starts.get(i.checked_sub(1)?)?;
        let j = self.exports.partition_point(|(a, _, _)| *a <= start);
        // In a hostile file the start may lie before the address's segment: the sum wraps
        // (a nonsense offset, as the file's headers are) rather than panics.
        let own = || {
            format!(
                "{module}+{:#x}",
                start.wrapping_sub(seg_address).wrapping_add(seg_offset)
            )
        };
        Some(match j.checked_sub(1).map(|j| &self.exports[j]) {
            Some((export, _, name)) if *export == start => demangle(name),
            // Inside the export's extent, or an export that does not say where it ends.
            Some((export, size, name)) if *size == 0 || start - export < *size => {
                format!("{}+{:#x}", demangle(name), start - export)
            }
            _ => match self.parts().get(&start) {
                Some(&owner) => format!("{}.cold", demangle(&self.exports[owner].2)),
                None => own(),
            },
        })
    }

    /// The split-off parts of exported functions (see the module's notes), found once.
    fn parts(&self) -> &HashMap<u64, usize> {
        self.parts.get_or_init(|| {
            let Some(data) = self
                .path
                .as_deref()
                .and_then(crate::process::target_file::map_stable)
            else {
                return HashMap::new();
            };
            let parts = self.find_parts(&data);
            log::debug!("{} split-off parts of exported functions", parts.len());
            parts
        })
    }

    /// Decodes each exported function of the x86-64 ELF file `data` and keeps the unwind
    /// entries its jumps enter past their start: a start no export has, claimed by one
    /// export only (two claiming one part leave it unnamed). Each part maps to its owner's
    /// index among the exports.
    pub fn find_parts(&self, data: &[u8]) -> HashMap<u64, usize> {
        use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};
        let mut parts: HashMap<u64, Option<usize>> = HashMap::new();
        let Ok(elf) = object::File::parse(data) else {
            return HashMap::new();
        };
        if elf.architecture() != object::Architecture::X86_64 {
            return HashMap::new();
        }
        let is_export = |start: u64| {
            self.exports
                .binary_search_by_key(&start, |(a, _, _)| *a)
                .is_ok()
        };
        let mut budget = MAX_DECODED_BYTES;
        let mut instruction = Instruction::default();
        for (index, (address, size, _)) in self.exports.iter().enumerate() {
            let (address, size) = (*address, *size);
            // An export at the top of the address space whose end passes 2^64 is the file's
            // nonsense: skipped, as one too large is.
            let Some(end) = address.checked_add(size) else {
                continue;
            };
            if size == 0 || size > budget {
                continue;
            }
            // The function's bytes, from the segment that holds them all.
            let Some(code) = self.segments.iter().find_map(|&(offset, file_size, base)| {
                let start = address.checked_sub(base)?;
                let end = start.checked_add(size).filter(|&end| end <= file_size)?;
                data.get(
                    usize::try_from(offset.checked_add(start)?).ok()?
                        ..usize::try_from(offset.checked_add(end)?).ok()?,
                )
            }) else {
                continue;
            };
            budget -= size;
            let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
            while decoder.can_decode() {
                decoder.decode_out(&mut instruction);
                // Jumps and conditional jumps to a fixed place: a call's target is a function.
                if instruction.op0_kind() != OpKind::NearBranch64
                    || instruction.mnemonic() == Mnemonic::Call
                {
                    continue;
                }
                let target = instruction.near_branch_target();
                if (address..end).contains(&target) {
                    continue;
                }
                let i = self.starts.partition_point(|&s| s <= target);
                let Some(&part) = i.checked_sub(1).and_then(|i| self.starts.get(i)) else {
                    continue;
                };
                // A jump to a function's start is a tail call; an unwind entry that starts
                // inside the export is its own (its extent ran past the symbol's size).
                if part == target || (address..end).contains(&part) || is_export(part) {
                    continue;
                }
                parts
                    .entry(part)
                    .and_modify(|owner| {
                        if *owner != Some(index) {
                            *owner = None
                        }
                    })
                    .or_insert(Some(index));
            }
        }
        parts
            .into_iter()
            .filter_map(|(part, owner)| Some((part, owner?)))
            .collect()
    }
}

/// Longest native frame name kept, in bytes (as V8's names are read): a target's symbol can
/// be any length, and a C++ name grows when demangled (`f<int, int, ...>` from `_Z1fIii...`);
/// a longer name is cut at this many bytes and ends in `…`.
pub const MAX_NAME_BYTES: usize = 4096;

/// A symbol's readable name, for exact symbols and these alike: Rust (legacy and v0, without
/// the hash) and C++ (Itanium, `_Z`) names demangled, anything else as it is. A plain C name
/// stays plain: read as an Itanium type, `a` would be `signed char` and `b` `bool`. At most
/// [`MAX_NAME_BYTES`] (and the `…`); a name already longer is cut, not demangled.
pub(crate) fn demangle(name: &str) -> String {
    if name.len() > MAX_NAME_BYTES {
        return cut_name(name);
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return cut_name(&format!("{rust:#}"));
    }
    if name.starts_with("_Z") {
        if let Ok(cpp) = cpp_demangle::Symbol::new(name).and_then(|s| {
            s.demangle()
                .map_err(|_| cpp_demangle::error::Error::UnexpectedText)
        }) {
            return cut_name(&cpp);
        }
    }
    name.to_string()
}

/// `name` cut to [`MAX_NAME_BYTES`] at a character's start, with `…` where it was cut.
fn cut_name(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_string();
    }
    let mut end = MAX_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of `name+0xOFF` frames read as exact symbols' do (issue 27: cc1plus showed
    /// `_Z14debug_df_chainP7df_link+0x16c0`).
    #[test]
    fn exported_names_are_demangled() {
        assert_eq!(
            demangle("_Z14debug_df_chainP7df_link"),
            "debug_df_chain(df_link*)"
        );
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("memcpy"), "memcpy");
        assert_eq!(demangle("_Znot a symbol"), "_Znot a symbol");
    }

    /// A target's symbol names are any length: one past the bound, or a C++ name that
    /// demangles past it, is cut there (at a character's start) and says so.
    #[test]
    fn long_names_are_cut() {
        let long = "é".repeat(3000);
        let cut = demangle(&long);
        assert!(
            cut.len() <= MAX_NAME_BYTES + '…'.len_utf8(),
            "{}",
            cut.len()
        );
        assert!(cut.ends_with('…') && cut.starts_with("éé"));
        // 2000 `int` arguments: 2 KiB mangled is within the bound, 10 KiB demangled is not.
        let mangled = format!("_Z1fI{}Evv", "i".repeat(2000));
        let demangled = demangle(&mangled);
        assert!(
            demangled.starts_with("void f<int, int"),
            "{}",
            &demangled[..40]
        );
        assert!(demangled.ends_with('…'));
        assert!(demangled.len() <= MAX_NAME_BYTES + '…'.len_utf8());
        // Within the bound, untouched.
        assert_eq!(demangle("_Z1fIiiEvv"), "void f<int, int>()");
    }

    /// A binary's segments, starts and exports are the target's: offsets, addresses and sizes
    /// whose sums pass 2^64, and a function start before its address's segment, name what
    /// they can and never overflow.
    #[test]
    fn sums_past_the_address_space_name_nothing_and_never_panic() {
        let exe = std::fs::read(std::fs::read_link("/proc/self/exe").unwrap()).unwrap();
        let hostile = FunctionStarts {
            starts: vec![0x10, 0x20, u64::MAX - 8],
            exports: vec![
                (0x10, u64::MAX, "huge".into()),
                (u64::MAX - 8, 0x100, "edge".into()),
            ],
            segments: vec![
                (u64::MAX - 16, 64, 0x1000),
                (0x100, 0x100, u64::MAX - 0x80),
                (0, u64::MAX, 0),
            ],
            ..Default::default()
        };
        // In the first segment, whose end passes 2^64: address 0x1006, in `huge` (whose
        // extent passes 2^64 too).
        assert_eq!(
            hostile.name("m", u64::MAX - 10).as_deref(),
            Some("huge+0x10")
        );
        // In the second, at an address past 2^64: nothing.
        assert_eq!(hostile.name("m", 0x1f0), None);
        assert_eq!(hostile.name("m", 0x110).as_deref(), Some("huge+0x10"));
        // `edge`'s code would end past 2^64 in the only segment that could hold it: not
        // decoded, so no part is found.
        assert!(hostile.find_parts(&exe).is_empty());
        // An export whose bytes all lie in a segment at the top of the address space, its
        // end past 2^64 (seen while writing the stripped_names fuzz target): skipped, not decoded.
        let top = FunctionStarts {
            starts: vec![u64::MAX - 0x80],
            exports: vec![(u64::MAX - 0x80, 0x100, "top".into())],
            segments: vec![(0x100, 0x100, u64::MAX - 0x80)],
            ..Default::default()
        };
        assert!(top.find_parts(&exe).is_empty());
        // A start before the segment of its address, named by the offset's sum (wrapped).
        let before = FunctionStarts {
            starts: vec![0x10],
            segments: vec![(0x100, 0x100, 0x1000)],
            ..Default::default()
        };
        assert_eq!(
            before.name("m", 0x110).as_deref(),
            Some("m+0xfffffffffffff110")
        );
    }

    /// A hostile library's export with an empty name (the stripped_names fuzz target's find,
    /// kept in its corpus) names nothing with it: every name read from it is non-empty.
    #[test]
    fn a_nameless_export_names_nothing() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/corpus/stripped_names/hostile-nameless-export"
        );
        let data = std::fs::read(path).unwrap();
        let starts = FunctionStarts::parse(&data).expect("the find parses");
        assert!(starts.exports.iter().all(|(_, _, name)| !name.is_empty()));
        let named: Vec<String> = (0..data.len() as u64)
            .filter_map(|offset| starts.name("m", offset))
            .collect();
        assert!(!named.is_empty());
        assert!(named.iter().all(|n| !n.is_empty()), "{named:?}");
    }

    /// This test binary is not stripped, so its own symbols say where its functions start:
    /// the unwind table must agree, and an address inside a function names that function's
    /// start whichever instruction it is.
    #[test]
    // The test looks itself up: it must stay a function of its own, whatever the optimizer
    // makes of the crate (at opt-level 2 it was inlined into the harness's closure once the
    // crate grew).
    #[inline(never)]
    fn unwind_table_finds_function_starts() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let data = std::fs::read(&exe).unwrap();
        let starts = FunctionStarts::parse(&data).expect("test binaries have .eh_frame_hdr");
        assert!(starts.starts.len() > 100, "{}", starts.starts.len());
        let elf = object::File::parse(&*data).unwrap();
        let function = elf
            .symbols()
            .find(|s| {
                s.kind() == SymbolKind::Text
                    && s.size() > 16
                    && s.name()
                        .is_ok_and(|n| n.contains("unwind_table_finds_function_starts"))
            })
            .expect("this test's own symbol");
        assert!(starts.starts.binary_search(&function.address()).is_ok());
        let &(seg_offset, _, seg_address) = starts
            .segments
            .iter()
            .find(|(_, size, address)| {
                *address <= function.address() && function.address() < address + size
            })
            .unwrap();
        let offset_of = |address: u64| address - seg_address + seg_offset;
        let at_start = starts.name("self", offset_of(function.address())).unwrap();
        let inside = starts
            .name("self", offset_of(function.address() + 9))
            .unwrap();
        assert_eq!(at_start, inside);
        // Test binaries export nothing, so the name is the module and the function's start.
        assert_eq!(
            at_start,
            format!("self+{:#x}", offset_of(function.address()))
        );
    }
}
