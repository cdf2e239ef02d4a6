//! Reads CPython objects out of a process: code objects (names, file, first line, line table),
//! `str` objects (compact ASCII and compact 1/2/4-byte kinds) and `bytes` objects.

use std::collections::HashMap;

use anyhow::{anyhow, ensure};

use super::{
    layout::{unicode_state, Layout},
    linetable,
    memory::ProcessMemory,
};
use anyhow::Result;
use profiler_common::{PythonFrame, PythonProcess};

/// How a code object whose name is the empty string is named.
const EMPTY_NAME: &str = "[empty Python name]";

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
    /// The object's header words that tell it apart from another code object put at its
    /// address once it is freed (see [`CodeReader::identity`]).
    pub identity: CodeIdentity,
    /// The identity bits the kernel records in this code object's frames
    /// ([`profiler_common::PythonFrame::identity_of`] its identity word).
    pub identity_bits: u8,
}

/// A code object's type, name, file name and line table pointers, its first line and the word
/// the kernel takes its identity bits from (or a pointer to it), as read.
pub type CodeIdentity = [u64; 6];

impl CodeInfo {
    /// Bytes it keeps: its name, file name and line ranges.
    pub fn kept_bytes(&self) -> u64 {
        (self.name.len() + self.file.len() + std::mem::size_of_val(self.lines.as_slice())) as u64
    }

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

/// Bytes read past an object's header in the same system call, so that most names, paths and
/// line tables need no second read.
const SPECULATIVE_BYTES: usize = 256;

/// Reads code objects of one process, remembering what many share: the address of the `code`
/// type, and file names (one `str` per module, shared by its functions).
#[derive(Default)]
pub struct CodeReader {
    code_type: Option<u64>,
    files: HashMap<u64, String>,
}

impl CodeReader {
    /// Reads the code object at `addr`, checking that its type is `code`.
    pub fn read_code(
        &mut self,
        mem: &ProcessMemory,
        layout: &Layout,
        addr: u64,
    ) -> Result<CodeInfo> {
        let (header, identity) = Self::header(mem, layout, addr)?;
        let word = |off: u32| field_u64(&header, off);
        let ty = word(layout.object_type);
        if self.code_type != Some(ty) {
            let type_name = mem.read_c_string(
                mem.read_u64(ty.wrapping_add(layout.type_name as u64))?,
                MAX_TYPE_NAME,
            )?;
            ensure!(
                type_name == "code",
                "object at {addr:#x} is a {type_name:?}, not a code object"
            );
            self.code_type = Some(ty);
        }
        let name = read_str(
            mem,
            layout,
            word(layout.code_qualname.unwrap_or(layout.code_name)),
        )?;
        // A frame needs a name in every format (a folded stack's frames are separated by `;`,
        // and an empty one reads as a broken line): `types.CodeType` accepts an empty name.
        let name = if name.is_empty() {
            EMPTY_NAME.to_string()
        } else {
            name
        };
        let file_addr = word(layout.code_filename);
        let file = match self.files.get(&file_addr) {
            Some(file) => file.clone(),
            None => {
                let file = read_str(mem, layout, file_addr)?;
                self.files.insert(file_addr, file.clone());
                file
            }
        };
        let first_line = (word(layout.code_firstlineno) as u32 as i32).max(0) as u32;
        let line_table = read_bytes(mem, layout, word(layout.code_linetable))?;
        // The kernel's identity word, read as it reads it.
        let identity_bits = identity_bits(mem, &layout.kernel, word(layout.kernel.code_identity));
        Ok(CodeInfo {
            name,
            file,
            first_line,
            lines: linetable::ranges(layout.line_format, &line_table, first_line),
            identity,
            identity_bits,
        })
    }

    /// The identity of the object now at `addr` (one read of its header), to compare with a
    /// cached [`CodeInfo::identity`]: CPython frees code objects (3.10's startup modules'
    /// after their import) and puts later ones, of other functions, at their addresses.
    pub fn identity(mem: &ProcessMemory, layout: &Layout, addr: u64) -> Result<CodeIdentity> {
        Ok(Self::header(mem, layout, addr)?.1)
    }

    /// The header of the code object at `addr` and its identity.
    fn header(mem: &ProcessMemory, layout: &Layout, addr: u64) -> Result<(Vec<u8>, CodeIdentity)> {
        let fields = [
            layout.object_type,
            layout.code_qualname.unwrap_or(layout.code_name),
            layout.code_filename,
            layout.code_firstlineno,
            layout.code_linetable,
            layout.kernel.code_identity,
        ];
        let span = fields.iter().max().copied().unwrap_or(0) as usize + 8;
        let header = mem.read_vec(addr, span)?;
        let identity = fields.map(|off| field_u64(&header, off));
        Ok((header, identity))
    }
}

/// The identity bits the kernel records for a code object whose `code_identity` field holds
/// `word`, read as the kernel reads them: through the pointer where the layout says so, and
/// [`PythonFrame::UNKNOWN_IDENTITY`] where that read fails or finds a hash not computed yet.
pub fn identity_bits(mem: &ProcessMemory, k: &PythonProcess, word: u64) -> u8 {
    let word = if k.code_identity_deref == 0 {
        Some(word)
    } else if word == 0 {
        None
    } else {
        mem.read_u64(word.wrapping_add(k.code_identity_deref as u64))
            .ok()
            .filter(|&hash| hash != PythonFrame::HASH_NOT_COMPUTED)
    };
    word.map_or(PythonFrame::UNKNOWN_IDENTITY, PythonFrame::identity_of)
}

/// The 8 bytes at `off` of a header read (little-endian, as x86-64 stores them).
fn field_u64(header: &[u8], off: u32) -> u64 {
    let off = off as usize;
    u64::from_ne_bytes(
        header[off..off + 8]
            .try_into()
            .expect("within the header read"),
    )
}

/// Reads `header` bytes of an object at `addr` and, where the mapping allows, the
/// [`SPECULATIVE_BYTES`] after them.
fn read_object(mem: &ProcessMemory, addr: u64, header: usize) -> Result<Vec<u8>> {
    match mem.read_vec(addr, header + SPECULATIVE_BYTES) {
        Ok(bytes) => Ok(bytes),
        // The object ends near the end of its mapping: its header alone.
        Err(_) => Ok(mem.read_vec(addr, header)?),
    }
}

/// The `len` bytes at `at` of an object whose first bytes were read into `prefix`.
fn object_bytes(
    mem: &ProcessMemory,
    addr: u64,
    prefix: &[u8],
    at: usize,
    len: usize,
) -> Result<Vec<u8>> {
    match prefix.get(at..at + len) {
        Some(bytes) => Ok(bytes.to_vec()),
        None => Ok(mem.read_vec(addr.wrapping_add(at as u64), len)?),
    }
}

/// Reads a `str` object as UTF-8.
pub fn read_str(mem: &ProcessMemory, layout: &Layout, addr: u64) -> Result<String> {
    ensure!(addr != 0, "null string pointer");
    let prefix = read_object(mem, addr, layout.unicode_compact_size as usize)?;
    // The bit fields from `kind` on (free-threaded 3.14+ keep them past a whole byte).
    let state = (field_u64(&prefix, layout.unicode_state) as u32) >> layout.unicode_kind_shift;
    let length = field_u64(&prefix, layout.unicode_length);
    ensure!(
        state & unicode_state::COMPACT != 0,
        "str at {addr:#x} is not compact (a legacy string; code objects never hold one)"
    );
    let chars = length.min(MAX_STRING_CHARS) as usize;
    if state & unicode_state::ASCII != 0 {
        let bytes = object_bytes(
            mem,
            addr,
            &prefix,
            layout.unicode_ascii_size as usize,
            chars,
        )?;
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    let kind = state & unicode_state::KIND_MASK;
    ensure!(
        matches!(kind, 1 | 2 | 4),
        "str at {addr:#x} has kind {kind}"
    );
    let data = object_bytes(
        mem,
        addr,
        &prefix,
        layout.unicode_compact_size as usize,
        chars * kind as usize,
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
    let prefix = read_object(mem, addr, layout.bytes_data as usize)?;
    let size = field_u64(&prefix, layout.bytes_size);
    if size > MAX_LINE_TABLE {
        return Err(anyhow!("bytes at {addr:#x}: implausible size {size}"));
    }
    object_bytes(
        mem,
        addr,
        &prefix,
        layout.bytes_data as usize,
        size as usize,
    )
}
