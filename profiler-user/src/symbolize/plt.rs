//! Names for PLT stubs, as perf writes them (`memcpy@plt`): the symbol tables cover no stub,
//! so without this a sample in one is named after whatever symbol precedes the PLT (`_init`).
//!
//! Each stub jumps through a GOT slot (`jmp *slot(%rip)`, after an `endbr64` and a `bnd`
//! prefix where the binary is built for IBT), and the dynamic relocation of that slot names
//! the function the stub calls. The lazy-binding entries of an IBT `.plt` jump back to the
//! resolver instead and push their index in `.rela.plt`, which names the function as well.
//! Sections read: `.plt`, `.plt.sec` (IBT) and `.plt.got` (functions whose address is also
//! taken). x86-64 only, as the unwinder.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
};

use object::{
    elf,
    read::elf::{ElfFile64, SectionHeader},
    Endianness, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget,
};

/// The PLT sections stubs live in.
const PLT_SECTIONS: [&str; 3] = [".plt", ".plt.sec", ".plt.got"];
/// `endbr64`, which starts every stub of a binary built for IBT.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// The `bnd` prefix (MPX) some linkers put before a stub's jump.
const BND: u8 = 0xf2;
/// `jmp *disp32(%rip)`: opcode and ModRM, then a 4-byte displacement.
const JMP_RIP: [u8; 2] = [0xff, 0x25];
/// `push imm32`.
const PUSH_IMM32: u8 = 0x68;

/// The PLT stubs of one ELF file, by file offset.
#[derive(Debug, Default)]
pub struct PltStubs {
    /// (first byte, end) of each stub as file offsets, with its name (`memcpy@plt`), sorted.
    stubs: Vec<(u64, u64, String)>,
}

impl PltStubs {
    /// Reads the PLT stubs of the ELF file at `path`; `None` when it is not a 64-bit ELF
    /// file or has no stub that names a function.
    pub fn read(path: &Path) -> Option<PltStubs> {
        // Only the headers, the PLT and the dynamic symbols are touched.
        Self::parse(&crate::process::target_file::map_stable(path)?)
    }

    /// The stubs of the ELF image `data`.
    pub fn parse(data: &[u8]) -> Option<PltStubs> {
        let elf = ElfFile64::<Endianness>::parse(data).ok()?;
        if elf.architecture() != object::Architecture::X86_64 {
            return None;
        }
        let endian = elf.endian();
        let dynsym = elf.dynamic_symbol_table()?;
        // `.rela.plt` in order: a lazy-binding entry pushes its index in it.
        let jump_slots: Vec<u64> = elf
            .section_by_name(".rela.plt")
            .and_then(|s| {
                s.elf_section_header()
                    .rela(endian, data)
                    .ok()
                    .flatten()
                    .map(|(relas, _)| relas.iter().map(|r| r.r_offset.get(endian)).collect())
            })
            .unwrap_or_default();
        // Each stub's GOT slot first, so that only those relocations' symbols are named:
        // libtorch_cpu.so has 357k dynamic relocations and 30k stubs.
        let mut targets: Vec<(u64, u64, u64)> = Vec::new();
        for name in PLT_SECTIONS {
            let Some(section) = elf.section_by_name(name) else {
                continue;
            };
            let header = section.elf_section_header();
            if header.sh_type(endian) != elf::SHT_PROGBITS {
                continue;
            }
            let (Some((file_start, _)), Ok(code)) = (section.file_range(), section.data()) else {
                continue;
            };
            let entry_size = match header.sh_entsize(endian) {
                0 if name == ".plt.got" => 8,
                0 => 16,
                n => n,
            };
            for (i, entry) in code.chunks_exact(entry_size as usize).enumerate() {
                let at = i as u64 * entry_size;
                let slot = match stub_target(entry, section.address() + at) {
                    Some(Target::Slot(slot)) => Some(slot),
                    Some(Target::JumpSlotIndex(index)) => jump_slots.get(index as usize).copied(),
                    None => None,
                };
                if let Some(slot) = slot {
                    let start = file_start + at;
                    targets.push((start, start + entry_size, slot));
                }
            }
        }
        let wanted: HashSet<u64> = targets.iter().map(|t| t.2).collect();
        // GOT slot address -> the function its relocation names.
        let mut slots: HashMap<u64, String> = HashMap::new();
        for (slot, relocation) in elf.dynamic_relocations().into_iter().flatten() {
            if !wanted.contains(&slot) {
                continue;
            }
            if let RelocationTarget::Symbol(index) = relocation.target() {
                if let Some(name) = dynsym
                    .symbol_by_index(index)
                    .ok()
                    .and_then(|s| s.name().ok())
                    .filter(|n| !n.is_empty())
                {
                    slots.insert(slot, name.to_string());
                }
            }
        }
        let mut stubs: Vec<(u64, u64, String)> = targets
            .into_iter()
            .filter_map(|(start, end, slot)| {
                Some((start, end, format!("{}@plt", slots.get(&slot)?)))
            })
            .collect();
        if stubs.is_empty() {
            return None;
        }
        stubs.sort_unstable();
        Some(PltStubs { stubs })
    }

    /// The name of the stub at file offset `offset`, if one is there.
    pub fn name(&self, offset: u64) -> Option<&str> {
        let i = self.stubs.partition_point(|(start, _, _)| *start <= offset);
        let (_, end, name) = self.stubs.get(i.checked_sub(1)?)?;
        (offset < *end).then_some(name.as_str())
    }
}

/// Where a stub leads.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// It jumps through the GOT slot at this address.
    Slot(u64),
    /// It pushes this index in `.rela.plt` and jumps to the resolver.
    JumpSlotIndex(u32),
}

/// Decodes the first real instruction of the stub `code` at address `address`.
fn stub_target(code: &[u8], address: u64) -> Option<Target> {
    let mut at = 0;
    if code.starts_with(&ENDBR64) {
        at += ENDBR64.len();
    }
    if code.get(at) == Some(&BND) {
        at += 1;
    }
    let rest = code.get(at..)?;
    if rest.starts_with(&JMP_RIP) {
        let disp = i32::from_le_bytes(rest.get(2..6)?.try_into().ok()?);
        let next = address + at as u64 + 6;
        return Some(Target::Slot(next.wrapping_add_signed(i64::from(disp))));
    }
    if rest.first() == Some(&PUSH_IMM32) {
        let index = u32::from_le_bytes(rest.get(1..5)?.try_into().ok()?);
        return Some(Target::JumpSlotIndex(index));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_of_every_layout_are_decoded() {
        // .plt without IBT: jmp *0x2fe2(%rip) at 0x1030 -> slot 0x4018.
        let plt = [
            0xff, 0x25, 0xe2, 0x2f, 0, 0, 0x68, 3, 0, 0, 0, 0xe9, 0, 0, 0, 0,
        ];
        assert_eq!(stub_target(&plt, 0x1030), Some(Target::Slot(0x4018)));
        // .plt.sec: endbr64; bnd jmp *0x2f62(%rip) at 0x1090 -> 0x1090 + 4 + 1 + 6 + 0x2f62.
        let sec = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x62, 0x2f, 0, 0, 0x0f, 0x1f, 0x44, 0, 0,
        ];
        assert_eq!(
            stub_target(&sec, 0x1090),
            Some(Target::Slot(0x1090 + 11 + 0x2f62))
        );
        // The lazy entry of an IBT .plt: endbr64; push $2; jmp resolver.
        let lazy = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 2, 0, 0, 0, 0xe9, 0, 0, 0, 0, 0x66, 0x90,
        ];
        assert_eq!(stub_target(&lazy, 0x1050), Some(Target::JumpSlotIndex(2)));
        // The resolver's own entry pushes a GOT word first: not a stub of a function.
        let plt0 = [
            0xff, 0x35, 0, 0, 0, 0, 0xff, 0x25, 0, 0, 0, 0, 0x0f, 0x1f, 0x40, 0,
        ];
        assert_eq!(stub_target(&plt0, 0x1020), None);
    }

    #[test]
    fn this_test_binary_names_its_own_stubs() {
        // The test binary is a PIE linked against libc: it has stubs, each named after a
        // function (checked against objdump's labels by the end-to-end symbols test).
        let exe = std::env::current_exe().unwrap();
        let stubs = PltStubs::read(&exe).expect("PLT stubs in the test binary");
        assert!(stubs
            .stubs
            .iter()
            .all(|(s, e, n)| s < e && n.ends_with("@plt")));
        let (start, end, name) = &stubs.stubs[0];
        assert_eq!(stubs.name(*start), Some(name.as_str()));
        assert_eq!(stubs.name(end - 1), Some(name.as_str()));
        assert_eq!(stubs.name(start - 1), None);
    }
}
