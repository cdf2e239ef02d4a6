//! Symbols of a stripped system library from its separate debug file (Debian's `-dbg`
//! packages: `/usr/lib/debug/.build-id/xx/yyyy.debug`), read from its symbol table alone.
//!
//! The library's own `.dynsym` names only its exports: libc's `start_thread` and
//! `__libc_start_call_main` are in the debug file's `.symtab`. blazesym finds that file by
//! itself when it reads DWARF, but then it also decompresses the file's DWARF (libc's: 18 ms
//! of CPU and 10 MiB kept for the run, on a target's CPUs, half of a short run's naming and a
//! third of its peak memory) for what the symbol table gives as well: the function's name.
//! Inlined functions and source lines inside system libraries are what is left out; they
//! come back with `--line-numbers`, which reads the DWARF as before.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment};

use crate::process::target_file::{gnu_build_id, map_stable, ElfReader};

/// Where Debian (and most distributions) install debug files by build id.
const BUILD_ID_DIR: &str = "/usr/lib/debug/.build-id";

/// A stripped object's debug file, and how to place the object's file offsets in it.
#[derive(Clone, Debug)]
pub struct DebugSymbols {
    /// The debug file (its symbol table is read; its DWARF is not).
    pub path: PathBuf,
    /// The object's loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

impl DebugSymbols {
    /// The debug file of the object at `path` with GNU build id `build_id` (hex), where the
    /// object has no symbol table of its own and an installed debug file of that build id has
    /// one; `None` otherwise (blazesym then reads the object as before).
    pub fn find(path: &Path, build_id: Option<&str>) -> Option<DebugSymbols> {
        let build_id =
            build_id.filter(|id| id.len() > 2 && id.bytes().all(|b| b.is_ascii_hexdigit()))?;
        let data = map_stable(path)?;
        let object = object::File::parse(&*data).ok()?;
        if object.section_by_name(".symtab").is_some() {
            return None;
        }
        let segments: Vec<(u64, u64, u64)> = object
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let debug = Path::new(BUILD_ID_DIR)
            .join(&build_id[..2])
            .join(format!("{}.debug", &build_id[2..]));
        if !std::fs::symlink_metadata(&debug).is_ok_and(|m| m.is_file()) {
            return None;
        }
        // The file at that name must be that build's, with a symbol table to read.
        let reader = ElfReader::new(std::fs::File::open(&debug).ok()?);
        let id: String = gnu_build_id(&reader)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if id != build_id {
            return None;
        }
        let debug_data = map_stable(&debug)?;
        let debug_object = object::File::parse(&*debug_data).ok()?;
        debug_object.section_by_name(".symtab")?;
        Some(DebugSymbols {
            path: debug,
            segments,
        })
    }

    /// The virtual address (as the symbol tables give them) of `file_offset` in the object.
    pub fn virt_offset(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(offset, size, _)| (*offset..offset + size).contains(&file_offset))
            .map(|(offset, _, address)| address + (file_offset - offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libc (stripped, with libc6-dbg installed by `cargo xtask setup`) is named from its
    /// debug file: `start_thread` is in no table of libc.so.6 itself.
    #[test]
    fn libc_is_found_with_its_debug_file_and_offsets_land_in_its_text() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let reader = ElfReader::new(std::fs::File::open(libc).unwrap());
        let id: String = gnu_build_id(&reader)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let debug = DebugSymbols::find(libc, Some(&id)).expect("libc6-dbg's debug file");
        assert!(
            debug.path.starts_with(BUILD_ID_DIR),
            "{}",
            debug.path.display()
        );
        // blazesym reads the debug file's symbols at virtual addresses: where start_thread is.
        use blazesym::symbolize::{source, Input, Symbolizer};
        let inspector = blazesym::inspect::Inspector::new();
        let found = inspector
            .lookup(
                &blazesym::inspect::source::Source::Elf(blazesym::inspect::source::Elf::new(
                    &debug.path,
                )),
                &["start_thread"],
            )
            .unwrap();
        let start = found[0]
            .first()
            .expect("start_thread in the debug file")
            .addr;
        let file_offset = debug
            .segments
            .iter()
            .find(|(_, size, address)| (*address..address + size).contains(&start))
            .map(|(offset, _, address)| offset + (start - address))
            .unwrap();
        assert_eq!(debug.virt_offset(file_offset + 4), Some(start + 4));
        let mut elf = source::Elf::new(&debug.path);
        elf.debug_syms = false;
        let symbolizer = Symbolizer::new();
        let named = symbolizer
            .symbolize(&source::Source::Elf(elf), Input::VirtOffset(&[start + 4]))
            .unwrap();
        assert_eq!(named[0].as_sym().map(|s| &*s.name), Some("start_thread"));

        // An object with a symbol table of its own, or a build id with no file: not found.
        assert!(DebugSymbols::find(Path::new("/proc/self/exe"), Some(&id)).is_none());
        assert!(DebugSymbols::find(libc, Some("00ff")).is_none());
        assert!(DebugSymbols::find(libc, Some("../../etc")).is_none());
        assert!(DebugSymbols::find(libc, None).is_none());
    }
}
