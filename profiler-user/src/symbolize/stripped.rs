//! Names for code that no symbol covers, as in stripped libraries (Debian's liblzma has only
//! its exported functions in `.dynsym`): without them every sampled address of one internal
//! function would be a row of its own (`liblzma.so.5+0x1692b`, `+0x16904`, ...).
//!
//! The unwind tables (`.eh_frame_hdr`) list where every function starts, stripped or not,
//! so an address is named by the start of its function, relative to the nearest exported
//! function before it, as perf writes such frames: `lzma_code+0x1a0` (all samples of that
//! internal function share the name), or `module+0xSTART` when no export precedes it.

use std::path::Path;

use gimli::{BaseAddresses, EhFrameHdr, Pointer, RunTimeEndian};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

/// What a binary says about its functions' extents when its symbols do not.
#[derive(Debug, Default)]
pub struct FunctionStarts {
    /// Function entry points (ELF virtual addresses), sorted.
    starts: Vec<u64>,
    /// Exported functions (`.dynsym`) with their addresses, sorted by address.
    exports: Vec<(u64, String)>,
    /// Loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

impl FunctionStarts {
    /// Reads the unwind table, exports and segments of the ELF file at `path`; `None` when
    /// it is not an ELF file or has no unwind table.
    pub fn read(path: &Path) -> Option<FunctionStarts> {
        // Only the headers, `.eh_frame_hdr` and the dynamic symbols are touched.
        Self::parse(&crate::process::target_file::map_stable(path)?)
    }

    fn parse(data: &[u8]) -> Option<FunctionStarts> {
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
        let mut exports: Vec<(u64, String)> = elf
            .dynamic_symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
            .filter_map(|s| Some((s.address(), s.name().ok()?.to_string())))
            .collect();
        // Aliases share an address: keep one name for it, the shortest, then the first.
        exports.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(a.1.len().cmp(&b.1.len()))
                .then(a.1.cmp(&b.1))
        });
        exports.dedup_by_key(|e| e.0);
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
        })
    }

    /// The name of the function holding file offset `offset` of this binary (`module` is
    /// its file name), when the unwind table knows where that function starts.
    pub fn name(&self, module: &str, offset: u64) -> Option<String> {
        let &(seg_offset, _, seg_address) = self
            .segments
            .iter()
            .find(|(start, size, _)| *start <= offset && offset < start + size)?;
        let address = offset - seg_offset + seg_address;
        let i = self.starts.partition_point(|&s| s <= address);
        let start = *self.starts.get(i.checked_sub(1)?)?;
        let j = self.exports.partition_point(|(a, _)| *a <= start);
        Some(match j.checked_sub(1).map(|j| &self.exports[j]) {
            Some((export, name)) if *export == start => demangle(name),
            Some((export, name)) => format!("{}+{:#x}", demangle(name), start - export),
            None => format!("{module}+{:#x}", start - seg_address + seg_offset),
        })
    }
}

/// A symbol's readable name, for exact symbols and these alike: Rust (legacy and v0, without
/// the hash) and C++ (Itanium, `_Z`) names demangled, anything else as it is. A plain C name
/// stays plain: read as an Itanium type, `a` would be `signed char` and `b` `bool`.
pub(crate) fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    if name.starts_with("_Z") {
        if let Ok(cpp) = cpp_demangle::Symbol::new(name).and_then(|s| {
            s.demangle()
                .map_err(|_| cpp_demangle::error::Error::UnexpectedText)
        }) {
            return cpp;
        }
    }
    name.to_string()
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
