//! Finds a process's V8: the mapped object (the `node` binary, or Debian's `libnode.so.N`) that
//! exports V8's postmortem constants (`v8dbg_*`, which V8 builds for debuggers such as llnode
//! and mdb_v8), and reads them from the file.
//!
//! The constants are `int`s in the object's data (a few, zero, in its `.bss`); a file is the
//! target's to write, so each one used is checked for a sane range before the kernel or the
//! naming reads a byte with it ([`Constants::from_symbols`]).

use std::{collections::HashMap, path::PathBuf};

use anyhow::Context;
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};
use procfs::process::MMapPath;
use profiler_common::V8Process;

use crate::Result;

/// V8's version, `(major, minor, build)`.
pub type Version = (u32, u32, u32);

/// The V8 found in a process, and the constants bpfprof reads its frames with.
#[derive(Clone, Debug)]
pub struct FoundV8 {
    /// The object's path as the process sees it.
    pub path: PathBuf,
    /// V8's version (from `v8::internal::Version`).
    pub version: Version,
    /// What the kernel needs.
    pub kernel: V8Process,
    /// What naming frames needs.
    pub constants: Constants,
}

/// Field offsets and type tags for naming a frame's function (see [`super::heap`]), named
/// after the `v8dbg_*` constant each comes from.
#[derive(Clone, Debug, Default)]
#[allow(missing_docs)]
pub struct Constants {
    pub map_instance_type: u64,
    pub type_shared_function_info: u16,
    pub type_script: u16,
    pub type_scope_info: u16,
    pub type_fixed_array: u16,
    pub first_nonstring_type: u16,
    pub string_representation_mask: u16,
    pub seq_string_tag: u16,
    pub cons_string_tag: u16,
    pub thin_string_tag: u16,
    pub sliced_string_tag: u16,
    pub string_encoding_mask: u16,
    pub one_byte_string_tag: u16,
    pub string_length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub thin_actual: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub shared_name_or_scope_info: u64,
    pub shared_script_or_debug_info: u64,
    pub script_name: u64,
    pub script_line_ends: u64,
    pub script_source: u64,
    pub fixed_array_length: u64,
    pub fixed_array_data: u64,
    pub scope_info_first_vars: u64,
    pub scope_info_context_locals: u64,
    /// Whether ScopeInfo keeps the function's start and end positions in fixed slots (3 and
    /// 4, V8 12.8.44 on); before, they follow its variable-length part.
    pub scope_info_fixed_positions: bool,
    /// What reading an optimized frame's inlined functions and a frame's code kind needs;
    /// `None` where V8 does not export the Code object's layout (before V8 12 or so:
    /// Node 18 and 20), whose frames are then named as before, one per frame.
    pub code: Option<CodeConstants>,
}

/// The layout of V8's `Code` object and of the tables an optimized frame's inlined
/// functions are read from ([`super::heap::Heap::code`]).
#[derive(Clone, Debug, Default)]
#[allow(missing_docs)]
pub struct CodeConstants {
    pub type_code: u16,
    pub type_shared_function_info_wrapper: Option<u16>,
    /// `SharedFunctionInfoWrapper::shared_info`'s offset.
    pub wrapper_shared_info: u64,
    /// Instance types a source position table or inlining positions may have (`ByteArray`,
    /// `TrustedByteArray` from V8 12.4).
    pub types_byte_array: Vec<u16>,
    /// Instance types DeoptimizationData and its literal array may have (fixed arrays,
    /// trusted or protected, weak or not, as V8's versions changed them).
    pub types_fixed_array: Vec<u16>,
    pub instruction_start: u64,
    pub instruction_size: u64,
    pub flags: u64,
    pub position_table: u64,
    pub deoptimization_data: u64,
    pub kind_mask: u32,
    pub kind_shift: u32,
    /// `CodeKind::INTERPRETED_FUNCTION`, `BASELINE`; `MAGLEV` and `TURBOFAN_JS` follow
    /// `BASELINE` in V8's enum since Maglev's kind was added (V8 10).
    pub kind_interpreted: u32,
    pub kind_baseline: u32,
    pub deopt_inlined_count: u64,
    pub deopt_literal_array: u64,
    pub deopt_inlining_positions: u64,
    /// `Code::instruction_stream`'s offset, `InstructionStream`'s instruction start (its
    /// header's size) and type: finding a pc's Code from its instructions (V8 13's JSFunction
    /// holds a dispatch handle, no Code, and on-stack replacement code is no function's).
    pub instruction_stream: u64,
    pub stream_instruction_start: u64,
    pub type_instruction_stream: u16,
}

/// A mapped file: its path, its first mapping's address range, its device and inode.
type MappedFile = (PathBuf, (u64, u64), (u64, u64));

/// Why a process has no V8 bpfprof can read: `Ok(Err(reason))` of [`find`].
pub type NotV8 = String;

/// Whether a mapping's file is named like Node.js (`node`, `nodejs`, `libnode.so.N`): the only
/// objects [`find`] opens.
pub fn named_like_node(map: &procfs::process::MemoryMap) -> bool {
    matches!(&map.pathname, procfs::process::MMapPath::Path(path)
        if path.file_name().and_then(|n| n.to_str())
            .is_some_and(|name| name.starts_with("node") || name.starts_with("libnode")))
}

/// Finds the V8 of process `pid`; `Ok(Err(reason))` when it maps none, or one without the
/// constants bpfprof needs (the reason then says so, for the summary).
pub fn find(pid: u32) -> Result<std::result::Result<FoundV8, NotV8>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("read /proc/{pid}/maps"))?;
    // Only objects named like Node.js are opened (`node`, `nodejs`, `libnode.so.N`): a
    // process may map tens of thousands of things.
    let named_like_node = |line: &&str| {
        line.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with("node") || name.starts_with("libnode"))
    };
    let wanted: String = text
        .lines()
        .filter(named_like_node)
        .flat_map(|l| [l, "\n"])
        .collect();
    let maps =
        <procfs::process::MemoryMaps as procfs::FromBufRead>::from_buf_read(wanted.as_bytes())
            .with_context(|| format!("parse /proc/{pid}/maps"))?;
    let mut files: Vec<MappedFile> = Vec::new();
    for m in maps {
        if let MMapPath::Path(path) = m.pathname {
            if !files.iter().any(|(p, _, _)| *p == path) {
                let dev_ino = (libc::makedev(m.dev.0 as u32, m.dev.1 as u32), m.inode);
                files.push((path, m.address, dev_ino));
            }
        }
    }
    if files.is_empty() {
        return Ok(Err("no node binary or libnode mapped".into()));
    }
    let mut reasons = Vec::new();
    for (path, range, dev_ino) in files {
        let symbols = match postmortem_symbols(pid, &path, range, dev_ino) {
            Ok(s) => s,
            Err(e) => {
                reasons.push(format!("{}: {e:#}", path.display()));
                continue;
            }
        };
        if !symbols.keys().any(|k| k.starts_with("v8dbg_")) {
            reasons.push(format!(
                "{}: exports no V8 postmortem constants (v8dbg_*)",
                path.display()
            ));
            continue;
        }
        return Ok(match from_symbols(&symbols) {
            Ok((version, kernel, constants)) => Ok(FoundV8 {
                path,
                version,
                kernel,
                constants,
            }),
            Err(why) => Err(format!("V8 in {}: {why}", path.display())),
        });
    }
    Ok(Err(reasons.join("; ")))
}

/// The values of the object's `v8dbg_*` constants and V8 version fields, by symbol name.
fn postmortem_symbols(
    pid: u32,
    path: &std::path::Path,
    range: (u64, u64),
    dev_ino: (u64, u64),
) -> anyhow::Result<HashMap<String, i64>> {
    let (file, _) = crate::process::target_file::open_mapped(pid, range, path, dev_ino)
        .with_context(|| format!("open {} of pid {pid}", path.display()))?;
    let reader = crate::process::target_file::ElfReader::new(file);
    let elf = object::File::parse(&reader).map_err(|e| reader.explain(e.into()))?;
    let mut out = HashMap::new();
    let wanted = |name: &str| name.starts_with("v8dbg_") || name.starts_with(VERSION_PREFIX);
    // `.dynsym` first, where Node exports them; the full symbol table (tens of MiB in a
    // `node` with symbols) only when it has none.
    let has_dynamic = elf
        .dynamic_symbols()
        .any(|s| s.name().is_ok_and(|n| n.starts_with("v8dbg_")));
    let symbols: Box<dyn Iterator<Item = _>> = if has_dynamic {
        Box::new(elf.dynamic_symbols())
    } else {
        Box::new(elf.symbols())
    };
    for symbol in symbols {
        let Ok(name) = symbol.name() else { continue };
        if !wanted(name) || out.contains_key(name) || !symbol.is_definition() {
            continue;
        }
        let Some(section) = symbol
            .section_index()
            .and_then(|i| elf.section_by_index(i).ok())
        else {
            continue;
        };
        let value = if section.kind() == SectionKind::UninitializedData {
            0
        } else {
            match section.data_range(symbol.address(), 4) {
                Ok(Some(bytes)) => i32::from_le_bytes(bytes.try_into().unwrap_or_default()),
                _ => continue,
            }
        };
        out.insert(name.to_string(), value as i64);
        // The constants come out of .dynsym in one run; a few hundred in all.
        if out.len() > 4096 {
            break;
        }
    }
    Ok(out)
}

/// The mangled names of `v8::internal::Version`'s fields start so.
const VERSION_PREFIX: &str = "_ZN2v88internal7Version";

/// Largest field offset or frame slot distance believed: V8's objects and frames are small.
const MAX_OFFSET: i64 = 4096;

/// The kernel's and the naming's constants from the object's symbols, or why they cannot be
/// had. Constants some versions do not export are derived as the OpenTelemetry eBPF profiler
/// documents them (`interpreter/nodev8`).
pub fn from_symbols(
    s: &HashMap<String, i64>,
) -> std::result::Result<(Version, V8Process, Constants), String> {
    // A field's constant is named `v8dbg_class_CLASS__FIELD__TYPE`, and the type's spelling
    // changes between versions (`Object`, `Tagged_Object_`): the exact name, else any type.
    let get = |name: &str| {
        s.get(&format!("v8dbg_{name}")).copied().or_else(|| {
            let prefix = format!("v8dbg_{name}__");
            s.iter()
                .find(|(k, _)| k.starts_with(&prefix))
                .map(|(_, &v)| v)
        })
    };
    let need = |name: &str| get(name).ok_or_else(|| format!("no v8dbg_{name}"));
    let offset = |name: &str| -> std::result::Result<u64, String> {
        let v = need(name)?;
        if (0..MAX_OFFSET).contains(&v) {
            Ok(v as u64)
        } else {
            Err(format!("v8dbg_{name} = {v} is out of range"))
        }
    };
    let tag = |name: &str| -> std::result::Result<u16, String> {
        let v = need(name)?;
        u16::try_from(v).map_err(|_| format!("v8dbg_{name} = {v} is out of range"))
    };
    let version_field = |field: &str| {
        s.get(&format!("{VERSION_PREFIX}{field}E"))
            .map(|&v| v as u32)
    };
    let version = (
        version_field("6major_").ok_or("no V8 version")?,
        version_field("6minor_").ok_or("no V8 version")?,
        version_field("6build_").unwrap_or(0),
    );
    if need("SystemPointerSize")? != 8 {
        return Err("not a 64-bit V8".into());
    }
    // Pointer compression keeps 32-bit fields and 31-bit Smis; Node builds without it: its
    // Smis are the upper half of a word (shifted by the 1-bit tag and 31 bits more).
    if get("SmiShiftSize").is_some_and(|v| v != 31) {
        return Err("built with pointer compression, which bpfprof does not read".into());
    }
    // Frame slots: negative offsets from the frame pointer.
    let below = |name: &str| -> std::result::Result<u32, String> {
        let v = -need(name)?;
        if (8..=profiler_common::V8_FRAME_SLOT_BYTES as i64).contains(&v) && v % 8 == 0 {
            Ok(v as u32)
        } else {
            Err(format!("v8dbg_{name} = {} is not a frame slot", -v))
        }
    };
    let fp_function = below("off_fp_function")?;
    let fp_marker = below("off_fp_context_or_frame_type")?;
    let fp_bytecode_offset = match get("off_fp_bytecode_offset") {
        Some(_) => below("off_fp_bytecode_offset")?,
        // Before V8 9.5.2: two slots under the function (argument count, bytecode array).
        None => fp_function + 24,
    };
    let function_shared = offset("class_JSFunction__shared__SharedFunctionInfo")?;
    let function_code = match get("class_JSFunction__code") {
        Some(v) if (0..MAX_OFFSET).contains(&v) => v as u64,
        Some(v) => return Err(format!("JSFunction::code at {v} is out of range")),
        // Not exported by every version: its place beside `shared`.
        None if version >= (11, 7, 368) => function_shared - 8,
        None => function_shared + 24,
    };
    // JSFunction has subclasses (class constructors and others) since V8 9.0.14, their types
    // right after it (14, then 15 from 9.6.138), exported as a range only from V8 12 or so.
    let (function_type_first, function_type_last) =
        match (get("FirstJSFunctionType"), get("LastJSFunctionType")) {
            (Some(_), Some(_)) => (tag("FirstJSFunctionType")?, tag("LastJSFunctionType")?),
            _ => {
                let first = tag("type_JSFunction__JS_FUNCTION_TYPE")?;
                let count = match version {
                    v if v >= (9, 6, 138) => 15,
                    v if v >= (9, 0, 14) => 14,
                    _ => 1,
                };
                (first, first + count - 1)
            }
        };
    if function_type_last < function_type_first {
        return Err("its JSFunction type range is empty".into());
    }
    let kernel = V8Process {
        fp_marker,
        fp_function,
        fp_bytecode_offset,
        heap_object_map: offset("class_HeapObject__map__Map")? as u32,
        map_instance_type: offset("class_Map__instance_type__uint16_t")? as u32,
        function_shared: function_shared as u32,
        function_code: function_code as u32,
        function_type_first,
        function_type_last,
    };
    let script_name = offset("class_Script__name")?;
    let constants = Constants {
        map_instance_type: kernel.map_instance_type as u64,
        type_shared_function_info: tag("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE")?,
        type_script: tag("type_Script__SCRIPT_TYPE")?,
        type_scope_info: tag("type_ScopeInfo__SCOPE_INFO_TYPE")?,
        type_fixed_array: tag("type_FixedArray__FIXED_ARRAY_TYPE")?,
        first_nonstring_type: tag("FirstNonstringType")?,
        string_representation_mask: tag("StringRepresentationMask")?,
        seq_string_tag: get("SeqStringTag").unwrap_or(0) as u16,
        cons_string_tag: tag("ConsStringTag")?,
        thin_string_tag: tag("ThinStringTag")?,
        sliced_string_tag: tag("SlicedStringTag")?,
        string_encoding_mask: tag("StringEncodingMask")?,
        one_byte_string_tag: tag("OneByteStringTag")?,
        string_length: offset("class_String__length__int32_t")?,
        seq_one_byte_chars: offset("class_SeqOneByteString__chars__char")?,
        seq_two_byte_chars: offset("class_SeqTwoByteString__chars__char")?,
        cons_first: offset("class_ConsString__first__String")?,
        cons_second: offset("class_ConsString__second__String")?,
        thin_actual: offset("class_ThinString__actual__String")?,
        sliced_parent: offset("class_SlicedString__parent__String")?,
        sliced_offset: offset("class_SlicedString__offset__SMI")?,
        shared_name_or_scope_info: offset("class_SharedFunctionInfo__name_or_scope_info")?,
        // `script_or_debug_info` until V8 12 or so moved the debug info out, `script` after.
        shared_script_or_debug_info: offset("class_SharedFunctionInfo__script_or_debug_info")
            .or_else(|_| offset("class_SharedFunctionInfo__script"))?,
        script_name,
        script_line_ends: offset("class_Script__line_ends")?,
        script_source: match get("class_Script__source") {
            Some(_) => offset("class_Script__source")?,
            None => script_name - 8,
        },
        fixed_array_length: offset("class_FixedArrayBase__length__SMI")?,
        fixed_array_data: offset("class_FixedArray__data__uintptr_t")?,
        scope_info_first_vars: offset("scopeinfo_idx_first_vars")?,
        scope_info_context_locals: offset("scopeinfo_idx_ncontextlocals")?,
        scope_info_fixed_positions: version >= (12, 8, 44),
        code: code_constants(&get),
    };
    Ok((version, kernel, constants))
}

/// Where the object exports the `Code` object's instruction start, size and flags (V8 12 or
/// so on), the constants for reading optimized frames' inlining; `None` otherwise, or where
/// any is out of range (a file is the target's to write).
fn code_constants(get: &dyn Fn(&str) -> Option<i64>) -> Option<CodeConstants> {
    let offset = |name: &str| {
        get(name)
            .filter(|v| (0..MAX_OFFSET).contains(v))
            .map(|v| v as u64)
    };
    let tag = |name: &str| get(name).and_then(|v| u16::try_from(v).ok());
    let index = |name: &str| get(name).filter(|v| (1..64).contains(v)).map(|v| v as u64);
    let instruction_start = offset("class_Code__instruction_start")?;
    let instruction_size = offset("class_Code__instruction_size")?;
    let flags = offset("class_Code__flags")?;
    // Not exported: V8 keeps them first in Code, after the map (deoptimization data or
    // interpreter data, then the position table), with the code wrapper (V8 12.x on) and the
    // instruction stream before the instruction start, as the OpenTelemetry eBPF profiler
    // derives them.
    let position_table = match offset("class_Code__source_position_table") {
        Some(v) => v,
        None if tag("type_CodeWrapper__CODE_WRAPPER_TYPE").is_some() => {
            instruction_start.checked_sub(24)?
        }
        None => instruction_size.checked_sub(16)?,
    };
    let deoptimization_data = match offset("class_Code__deoptimization_data") {
        Some(v) => v,
        None => position_table.checked_sub(8)?,
    };
    let kind_baseline = get("CodeKindBaseline").filter(|v| (1..32).contains(v))? as u32;
    let kind_interpreted = match get("CodeKindInterpretedFunction") {
        Some(v) if (0..32).contains(&v) => v as u32,
        Some(_) => return None,
        // It precedes BASELINE in V8's enum.
        None => kind_baseline - 1,
    };
    let kind_mask = get("CodeKindFieldMask").filter(|v| (1..=0xff).contains(v))? as u32;
    let kind_shift = get("CodeKindFieldShift").filter(|v| (0..32).contains(v))? as u32;
    let types = |names: &[&str]| -> Vec<u16> { names.iter().filter_map(|n| tag(n)).collect() };
    let types_byte_array = types(&[
        "type_ByteArray__BYTE_ARRAY_TYPE",
        "type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE",
    ]);
    let types_fixed_array = types(&[
        "type_FixedArray__FIXED_ARRAY_TYPE",
        "type_WeakFixedArray__WEAK_FIXED_ARRAY_TYPE",
        "type_TrustedFixedArray__TRUSTED_FIXED_ARRAY_TYPE",
        "type_TrustedWeakFixedArray__TRUSTED_WEAK_FIXED_ARRAY_TYPE",
        "type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE",
        "type_ProtectedWeakFixedArray__PROTECTED_WEAK_FIXED_ARRAY_TYPE",
    ]);
    if types_byte_array.is_empty() || types_fixed_array.is_empty() {
        return None;
    }
    let wrapper = tag("type_SharedFunctionInfoWrapper__SHARED_FUNCTION_INFO_WRAPPER_TYPE");
    Some(CodeConstants {
        type_code: tag("type_Code__CODE_TYPE")?,
        type_shared_function_info_wrapper: wrapper,
        wrapper_shared_info: offset("class_SharedFunctionInfoWrapper__shared_info").unwrap_or(8),
        types_byte_array,
        types_fixed_array,
        instruction_start,
        instruction_size,
        flags,
        position_table,
        deoptimization_data,
        kind_mask,
        kind_shift,
        kind_interpreted,
        kind_baseline,
        deopt_inlined_count: index("DeoptimizationDataInlinedFunctionCountIndex")?,
        deopt_literal_array: index("DeoptimizationDataLiteralArrayIndex")?,
        deopt_inlining_positions: index("DeoptimizationDataInliningPositionsIndex")?,
        instruction_stream: offset("class_Code__instruction_stream")?,
        stream_instruction_start: offset("class_InstructionStream__instruction_start")
            .filter(|&v| v >= 16)?,
        type_instruction_stream: tag("type_InstructionStream__INSTRUCTION_STREAM_TYPE")?,
    })
}
