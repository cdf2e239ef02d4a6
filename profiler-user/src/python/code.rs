//! Reads CPython objects out of a process: code objects (names, file, first line, line table),
//! `str` objects (compact ASCII and compact 1/2/4-byte kinds) and `bytes` objects.

use anyhow::{anyhow, ensure};

use super::{
    layout::{unicode_state, Layout},
    linetable,
    memory::ProcessMemory,
};
use anyhow::Result;

/// Longest string read (in characters): longer names and paths are cut there.
const MAX_STRING_CHARS: u64 = 4096;
/// Largest line table read; a real one is a few bytes per instruction.
const MAX_LINE_TABLE: u64 = 1 << 20;
/// Longest type name compared with "code".
const MAX_TYPE_NAME: usize = 64;

/// What one code object says about its function.
#[derive(Clone, Debug)]
pub struct CodeInfo {
    /// The qualified name (3.11+), else the plain name.
    pub name: String,
    /// `co_filename`.
    pub file: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// `co_linetable` decoded, in address order.
    pub lines: Vec<linetable::LineRange>,
}

impl CodeInfo {
    /// The line of instruction `index` (in code units), or the first line where the table has
    /// none (artificial code, an index past the end).
    pub fn line(&self, index: u32) -> u32 {
        let addr = index.saturating_mul(2);
        let at = self.lines.partition_point(|r| r.end <= addr);
        self.lines
            .get(at)
            .filter(|r| r.start <= addr)
            .and_then(|r| r.line)
            .unwrap_or(self.first_line)
    }
}

/// Reads the code object at `addr`, checking that its type is `code`.
pub fn read_code(mem: &ProcessMemory, layout: &Layout, addr: u64) -> Result<CodeInfo> {
    let ty = mem.read_u64(addr + layout.object_type as u64)?;
    let type_name =
        mem.read_c_string(mem.read_u64(ty + layout.type_name as u64)?, MAX_TYPE_NAME)?;
    ensure!(
        type_name == "code",
        "object at {addr:#x} is a {type_name:?}, not a code object"
    );
    let name_field = layout.code_qualname.unwrap_or(layout.code_name);
    let name = read_str(mem, layout, mem.read_u64(addr + name_field as u64)?)?;
    let file = read_str(
        mem,
        layout,
        mem.read_u64(addr + layout.code_filename as u64)?,
    )?;
    let first_line = mem.read_i32(addr + layout.code_firstlineno as u64)?;
    let line_table = read_bytes(
        mem,
        layout,
        mem.read_u64(addr + layout.code_linetable as u64)?,
    )?;
    let first_line = first_line.max(0) as u32;
    Ok(CodeInfo {
        name,
        file,
        first_line,
        lines: linetable::ranges(layout.line_format, &line_table, first_line),
    })
}

/// Reads a `str` object as UTF-8.
pub fn read_str(mem: &ProcessMemory, layout: &Layout, addr: u64) -> Result<String> {
    ensure!(addr != 0, "null string pointer");
    let state = mem.read_u32(addr + layout.unicode_state as u64)?;
    let length = mem.read_u64(addr + layout.unicode_length as u64)?;
    ensure!(
        state & unicode_state::COMPACT != 0,
        "str at {addr:#x} is not compact (a legacy string; code objects never hold one)"
    );
    let chars = length.min(MAX_STRING_CHARS);
    if state & unicode_state::ASCII != 0 {
        let bytes = mem.read_vec(addr + layout.unicode_ascii_size as u64, chars as usize)?;
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    let kind = (state >> unicode_state::KIND_SHIFT) & unicode_state::KIND_MASK;
    ensure!(
        matches!(kind, 1 | 2 | 4),
        "str at {addr:#x} has kind {kind}"
    );
    let data = mem.read_vec(
        addr + layout.unicode_compact_size as u64,
        (chars * kind as u64) as usize,
    )?;
    let decoded: String = match kind {
        // Latin-1: each byte is the code point.
        1 => data.iter().map(|&b| b as char).collect(),
        2 => data
            .chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]) as u32)
            .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
    };
    Ok(decoded)
}

/// Reads a `bytes` object's contents.
pub fn read_bytes(mem: &ProcessMemory, layout: &Layout, addr: u64) -> Result<Vec<u8>> {
    ensure!(addr != 0, "null bytes pointer");
    let size = mem.read_u64(addr + layout.bytes_size as u64)?;
    if size > MAX_LINE_TABLE {
        return Err(anyhow!("bytes at {addr:#x}: implausible size {size}"));
    }
    Ok(mem.read_vec(addr + layout.bytes_data as u64, size as usize)?)
}
