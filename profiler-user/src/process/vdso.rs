//! The vDSO: the kernel's small shared object mapped into every process, with no file behind
//! it. Its ELF image is read from the target's memory, for its unwind table (see
//! [`crate::unwind`]) and for its function names (`__vdso_clock_gettime`, as perf names them).

use std::os::unix::fs::FileExt;

use object::{Object, ObjectSymbol, SymbolKind};

/// Largest vDSO image read (x86-64's is 8 KiB): a bound on what a mapping named `[vdso]`
/// makes bpfprof read.
pub const MAX_VDSO_BYTES: u64 = 1 << 20;

/// The ELF image of the vDSO mapped at `start..end` in process `pid`.
pub fn read_image(pid: u32, start: u64, end: u64) -> anyhow::Result<Vec<u8>> {
    let len = end.saturating_sub(start);
    if len > MAX_VDSO_BYTES {
        anyhow::bail!("a vDSO of {len} bytes is larger than any kernel's");
    }
    let mut image = vec![0u8; len as usize];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|mem| mem.read_exact_at(&mut image, start))
        .map_err(|e| anyhow::anyhow!("reading the vDSO from /proc/{pid}/mem: {e}"))?;
    Ok(image)
}

/// The functions the vDSO exports, by their offset in the image (which is their offset in
/// the mapping: the vDSO is linked at 0 and mapped whole).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VdsoSymbols {
    /// (start, end, name), sorted by start; one name per address range.
    functions: Vec<(u64, u64, String)>,
}

impl VdsoSymbols {
    /// The exported functions of the vDSO image `image`; `None` when it does not parse.
    pub fn parse(image: &[u8]) -> Option<VdsoSymbols> {
        let elf = object::File::parse(image).ok()?;
        let mut functions: Vec<(u64, u64, bool, String)> = elf
            .dynamic_symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
            .filter_map(|s| {
                let name = s.name().ok()?;
                // `clock_gettime` is a weak alias of `__vdso_clock_gettime`: the global name
                // is the one perf shows.
                Some((
                    s.address(),
                    s.address() + s.size(),
                    s.is_weak(),
                    name.to_string(),
                ))
            })
            .collect();
        functions.sort();
        functions.dedup_by_key(|f| f.0);
        Some(VdsoSymbols {
            functions: functions
                .into_iter()
                .map(|(start, end, _, name)| (start, end, name))
                .collect(),
        })
    }

    /// The name of the function at `offset` in the vDSO, if it is an exported one.
    pub fn name(&self, offset: u64) -> Option<&str> {
        let i = self
            .functions
            .partition_point(|(start, _, _)| *start <= offset);
        let (_, end, name) = self.functions.get(i.checked_sub(1)?)?;
        (offset < *end).then_some(name.as_str())
    }
}

/// This process's own vDSO: its mapping's range and its image, read from memory as a
/// target's is (for tests of what reads vDSO images).
#[cfg(test)]
pub(crate) fn own_image() -> ((u64, u64), Vec<u8>) {
    let maps = procfs::process::Process::myself().unwrap().maps().unwrap();
    let vdso = maps
        .iter()
        .find(|m| matches!(m.pathname, procfs::process::MMapPath::Vdso))
        .expect("a [vdso] mapping");
    let (start, end) = vdso.address;
    let image = read_image(std::process::id(), start, end).unwrap();
    ((start, end), image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_vdso_names_clock_gettime() {
        let ((start, end), image) = own_image();
        let symbols = VdsoSymbols::parse(&image).unwrap();
        // The address libc calls for clock_gettime, as the dynamic linker resolved it.
        let name = std::ffi::CString::new("__vdso_clock_gettime").unwrap();
        let version = std::ffi::CString::new("LINUX_2.6").unwrap();
        // SAFETY: dlvsym only reads the two strings; the vDSO is always loaded on x86-64.
        let addr = unsafe {
            let handle = libc::dlopen(
                std::ffi::CString::new("linux-vdso.so.1").unwrap().as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            );
            assert!(!handle.is_null(), "the vDSO is not loaded");
            libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) as u64
        };
        assert!((start..end).contains(&addr), "{addr:#x}");
        assert_eq!(symbols.name(addr - start), Some("__vdso_clock_gettime"));
        assert_eq!(
            symbols.name(addr - start + 16),
            Some("__vdso_clock_gettime")
        );
        assert_eq!(symbols.name(0), None);
    }
}
