//! A JVM's own description of its structures: `libjvm.so` exports `gHotSpotVMStructs` (type,
//! field, offset or static address), `gHotSpotVMTypes` (type sizes) and
//! `gHotSpotVMIntConstants`, with the strides and field offsets of those tables exported too,
//! for the serviceability agent. Reading them is how bpfprof learns a JVM's layout, whatever
//! its version or build, without a flag in the target.
//!
//! The tables live in the target's memory, which it controls: every read is bounded (entries,
//! string lengths), and a table that says nonsense refuses the process, never more.

use std::collections::HashMap;

use anyhow::{anyhow, Context};
use procfs::process::MMapPath;

use crate::runtime::cpython::memory::ProcessMemory;

/// Entries read from one table at most: JDK 17 has about 2,000 structs and 1,500 types.
const MAX_ENTRIES: usize = 20_000;
/// Longest type or field name read.
const MAX_NAME: usize = 256;

/// The JVM library a process maps, where its tables are.
#[derive(Debug)]
pub struct Libjvm {
    /// Its path as the process maps it.
    pub path: std::path::PathBuf,
    /// Runtime address of each of the exported symbols bpfprof reads.
    symbols: HashMap<&'static str, u64>,
}

/// The symbols read: the tables and their layout.
const SYMBOLS: [&str; 18] = [
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMLongConstants",
    "gHotSpotVMLongConstantEntryArrayStride",
];

/// Finds the `libjvm.so` of process `pid`: `Ok(None)` when it maps none.
pub fn find_libjvm(pid: u32) -> anyhow::Result<Option<Libjvm>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("read /proc/{pid}/maps"))?;
    // Only the lines of libjvm are parsed (a process may map tens of thousands of things).
    let wanted: String = text
        .lines()
        .filter(|l| l.ends_with("/libjvm.so"))
        .flat_map(|l| [l, "\n"])
        .collect();
    if wanted.is_empty() {
        return Ok(None);
    }
    let maps =
        <procfs::process::MemoryMaps as procfs::FromBufRead>::from_buf_read(wanted.as_bytes())
            .context("parse the maps")?;
    let Some(first) = maps
        .iter()
        .find(|m| matches!(m.pathname, MMapPath::Path(_)))
    else {
        return Ok(None);
    };
    let MMapPath::Path(path) = &first.pathname else {
        return Ok(None);
    };
    let dev_ino = (
        libc::makedev(first.dev.0 as u32, first.dev.1 as u32),
        first.inode,
    );
    let (file, _) = crate::process::target_file::open_mapped(pid, first.address, path, dev_ino)
        .with_context(|| format!("open {}", path.display()))?;
    let reader = crate::process::target_file::ElfReader::new(file);
    let bias = crate::unwind::table::load_bias(&reader, first.address.0, first.offset)?;
    use object::{Object, ObjectSymbol};
    let elf = object::File::parse(&reader)
        .map_err(|e| reader.explain(e.into()))
        .with_context(|| format!("parse {}", path.display()))?;
    let mut symbols = HashMap::new();
    for symbol in elf.dynamic_symbols() {
        let Ok(name) = symbol.name() else { continue };
        if let Some(wanted) = SYMBOLS.iter().find(|s| **s == name) {
            if symbol.is_definition() {
                symbols.insert(*wanted, symbol.address().wrapping_add(bias));
            }
        }
    }
    Ok(Some(Libjvm {
        path: path.clone(),
        symbols,
    }))
}

/// A field: its offset in its type, or the address of a static one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Offset of a member.
    Offset(u64),
    /// Address of a static member.
    Static(u64),
}

/// The tables read.
#[derive(Debug, Default)]
pub struct VmStructs {
    fields: HashMap<(String, String), Field>,
    /// Each field's C type, as the table names it.
    types: HashMap<(String, String), String>,
    sizes: HashMap<String, u64>,
    ints: HashMap<String, i32>,
}

impl VmStructs {
    /// Reads the tables of the JVM `libjvm` describes from `memory`.
    pub fn read(libjvm: &Libjvm, memory: &ProcessMemory) -> anyhow::Result<VmStructs> {
        let symbol = |name: &str| {
            libjvm
                .symbols
                .get(name)
                .copied()
                .ok_or_else(|| anyhow!("{} exports no {name}", libjvm.path.display()))
        };
        // Each exported layout word is a u64 in the target.
        let word = |name: &str| -> anyhow::Result<u64> { Ok(memory.read_u64(symbol(name)?)?) };
        let string = |at: u64| -> anyhow::Result<Option<String>> {
            if at == 0 {
                return Ok(None);
            }
            Ok(Some(memory.read_c_string(at, MAX_NAME)?))
        };
        let mut vm = VmStructs::default();
        let stride = bounded_stride(word("gHotSpotVMStructEntryArrayStride")?)?;
        let type_string_at = word("gHotSpotVMStructEntryTypeStringOffset")?;
        let (type_at, field_at, static_at, offset_at, address_at) = (
            word("gHotSpotVMStructEntryTypeNameOffset")?,
            word("gHotSpotVMStructEntryFieldNameOffset")?,
            word("gHotSpotVMStructEntryIsStaticOffset")?,
            word("gHotSpotVMStructEntryOffsetOffset")?,
            word("gHotSpotVMStructEntryAddressOffset")?,
        );
        let mut at = word("gHotSpotVMStructs")?;
        for _ in 0..MAX_ENTRIES {
            let entry = memory.read_vec(at, stride as usize)?;
            let u64_at = |off: u64| read_u64(&entry, off);
            let Some(type_name) = string(u64_at(type_at)?)? else {
                break;
            };
            if let Some(field) = string(u64_at(field_at)?)? {
                let type_string = string(u64_at(type_string_at)?)?.unwrap_or_default();
                vm.types
                    .insert((type_name.clone(), field.clone()), type_string);
                let is_static = read_u32(&entry, static_at)? != 0;
                let value = if is_static {
                    Field::Static(u64_at(address_at)?)
                } else {
                    Field::Offset(u64_at(offset_at)?)
                };
                vm.fields.insert((type_name, field), value);
            }
            at = at.wrapping_add(stride);
        }
        let stride = bounded_stride(word("gHotSpotVMTypeEntryArrayStride")?)?;
        let (name_at, size_at) = (
            word("gHotSpotVMTypeEntryTypeNameOffset")?,
            word("gHotSpotVMTypeEntrySizeOffset")?,
        );
        let mut at = word("gHotSpotVMTypes")?;
        for _ in 0..MAX_ENTRIES {
            let entry = memory.read_vec(at, stride as usize)?;
            let Some(name) = string(read_u64(&entry, name_at)?)? else {
                break;
            };
            vm.sizes.insert(name, read_u64(&entry, size_at)?);
            at = at.wrapping_add(stride);
        }
        let stride = bounded_stride(word("gHotSpotVMIntConstantEntryArrayStride")?)?;
        let (name_at, value_at) = (
            word("gHotSpotVMIntConstantEntryNameOffset")?,
            word("gHotSpotVMIntConstantEntryValueOffset")?,
        );
        let mut at = word("gHotSpotVMIntConstants")?;
        for _ in 0..MAX_ENTRIES {
            let entry = memory.read_vec(at, stride as usize)?;
            let Some(name) = string(read_u64(&entry, name_at)?)? else {
                break;
            };
            vm.ints.insert(name, read_u32(&entry, value_at)? as i32);
            at = at.wrapping_add(stride);
        }
        Ok(vm)
    }

    /// Field `field` of `type_name`.
    pub fn field(&self, type_name: &str, field: &str) -> Option<Field> {
        self.fields
            .get(&(type_name.to_string(), field.to_string()))
            .copied()
    }

    /// The offset of member `field` of `type_name` (bounded: no structure bpfprof reads is
    /// larger than 64 KiB), or an error that names it.
    pub fn offset(&self, type_name: &str, field: &str) -> anyhow::Result<u64> {
        match self.field(type_name, field) {
            Some(Field::Offset(o)) if o < 1 << 16 => Ok(o),
            Some(_) => Err(anyhow!("VMStructs: {type_name}::{field} is not a member")),
            None => Err(anyhow!("VMStructs has no {type_name}::{field}")),
        }
    }

    /// The first of `candidates` (type, field) that is a member: fields move between types
    /// across JDK versions.
    pub fn offset_of_any(&self, candidates: &[(&str, &str)]) -> anyhow::Result<u64> {
        candidates
            .iter()
            .find_map(|(t, f)| self.offset(t, f).ok())
            .ok_or_else(|| anyhow!("VMStructs has none of {candidates:?}"))
    }

    /// The address of static `field` of `type_name`.
    pub fn address(&self, type_name: &str, field: &str) -> anyhow::Result<u64> {
        match self.field(type_name, field) {
            Some(Field::Static(a)) => Ok(a),
            Some(_) => Err(anyhow!("VMStructs: {type_name}::{field} is not static")),
            None => Err(anyhow!("VMStructs has no {type_name}::{field}")),
        }
    }

    /// The size of `type_name` (bounded as offsets are).
    pub fn size(&self, type_name: &str) -> anyhow::Result<u64> {
        match self.sizes.get(type_name) {
            Some(&s) if s < 1 << 16 => Ok(s),
            Some(s) => Err(anyhow!("VMStructs: sizeof({type_name}) = {s}")),
            None => Err(anyhow!("VMStructs has no type {type_name}")),
        }
    }

    /// The width in bytes of integer member `field` of `type_name`, from its C type: JDK 25
    /// narrowed some (`HeapBlock::Header::_length` to `uint32_t`,
    /// `CodeBlob::_frame_complete_offset` to `int16_t`).
    pub fn width(&self, type_name: &str, field: &str) -> usize {
        let t = self
            .types
            .get(&(type_name.to_string(), field.to_string()))
            .map(String::as_str)
            .unwrap_or("");
        match t {
            "bool" | "u1" | "char" | "signed char" | "volatile signed char" | "jbyte" => 1,
            "u2" | "short" | "jshort" | "int16_t" | "uint16_t" => 2,
            "int" | "jint" | "juint" | "u4" | "int32_t" | "uint32_t" | "uint" | "CompLevel" => 4,
            _ => 8,
        }
    }

    /// Integer constant `name`.
    pub fn int(&self, name: &str) -> Option<i32> {
        self.ints.get(name).copied()
    }
}

/// A table's stride, refused past 1 KiB (the real ones are 16 to 48 bytes).
fn bounded_stride(stride: u64) -> anyhow::Result<u64> {
    if (8..=1024).contains(&stride) {
        Ok(stride)
    } else {
        Err(anyhow!("VMStructs: implausible entry stride {stride}"))
    }
}

fn read_u64(entry: &[u8], off: u64) -> anyhow::Result<u64> {
    let off = off as usize;
    entry
        .get(off..off.wrapping_add(8))
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| anyhow!("VMStructs: field offset {off} outside its entry"))
}

fn read_u32(entry: &[u8], off: u64) -> anyhow::Result<u32> {
    let off = off as usize;
    entry
        .get(off..off.wrapping_add(4))
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| anyhow!("VMStructs: field offset {off} outside its entry"))
}
