//! Reads the V8 heap objects that name a frame's function from the live process: the
//! SharedFunctionInfo the kernel recorded, its name (a string, or its ScopeInfo's), its
//! Script's name, and the line its start position lies on.
//!
//! Every read is bounded (strings, line tables and sources have size limits, string nesting a
//! depth) and every object's type is checked against its map before its fields are read: the
//! memory belongs to the target, which may have moved or freed the object since the sample,
//! or be hostile.

use std::collections::HashMap;

use anyhow::{anyhow, bail};

use super::detect::Constants;
use crate::runtime::cpython::memory::ProcessMemory;

/// Longest name read (a function or a script's).
const MAX_NAME_BYTES: u64 = 4096;
/// Longest source read to find line ends where the script has no line table yet.
const MAX_SOURCE_BYTES: u64 = 16 << 20;
/// Most lines a script's line table is read for.
const MAX_LINES: u64 = 1 << 20;
/// Deepest nesting of cons, thin and sliced strings followed.
const MAX_STRING_DEPTH: u32 = 16;
/// ScopeInfo slots looked at for the function's name and positions.
const SCOPE_INFO_SLOTS: usize = 16;

/// A JavaScript function, as bpfprof names its frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsFunction {
    /// Its name; `(anonymous)` when it has none.
    pub name: String,
    /// Its script's name (a path or URL; `node:internal/...` for Node's own).
    pub file: Option<String>,
    /// The line (1-based) of its start, where known.
    pub line: Option<u32>,
}

/// The name shown for a function without one.
pub const ANONYMOUS: &str = "(anonymous)";

/// A script's name and line ends, read once.
#[derive(Clone, Debug)]
struct ScriptInfo {
    name: Option<String>,
    line_ends: Vec<u32>,
}

/// Reads one process's heap with its V8's constants; keeps its scripts.
pub struct Heap {
    pub(super) memory: ProcessMemory,
    pub(super) c: Constants,
    scripts: HashMap<u64, ScriptInfo>,
    /// The map every InstructionStream has, once one was found ([`Heap::code_at`]).
    pub(super) stream_map: Option<u64>,
}

pub(super) fn is_heap_object(word: u64) -> bool {
    word & 3 == 1
}

pub(super) fn smi(word: u64) -> Option<i64> {
    (word & 1 == 0).then_some((word as i64) >> 32)
}

impl Heap {
    /// Reads `memory` with `constants`.
    pub fn new(memory: ProcessMemory, constants: Constants) -> Heap {
        Heap {
            memory,
            c: constants,
            scripts: HashMap::new(),
            stream_map: None,
        }
    }

    /// Whether this V8's Code objects can be read ([`Heap::code`]).
    pub fn reads_code(&self) -> bool {
        self.c.code.is_some()
    }

    /// Bytes read from the process so far.
    pub fn bytes_read(&self) -> u64 {
        self.memory.bytes_read()
    }

    pub(super) fn word(&self, at: u64) -> crate::Result<u64> {
        let mut b = [0u8; 8];
        self.memory.read_exact(at, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The field at `offset` of the object `tagged` points to.
    pub(super) fn field(&self, tagged: u64, offset: u64) -> crate::Result<u64> {
        self.word((tagged - 1).wrapping_add(offset))
    }

    /// The instance type of the object `tagged` points to.
    pub(super) fn type_of(&self, tagged: u64) -> anyhow::Result<u16> {
        if !is_heap_object(tagged) {
            bail!("{tagged:#x} is no heap object");
        }
        let map = self.field(tagged, 0)?;
        if !is_heap_object(map) {
            bail!("object {tagged:#x} has no map");
        }
        let mut b = [0u8; 2];
        self.memory
            .read_exact((map - 1).wrapping_add(self.c.map_instance_type), &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Names the function of SharedFunctionInfo `shared` (tagged).
    pub fn function(&mut self, shared: u64) -> anyhow::Result<JsFunction> {
        let c = &self.c;
        let kind = self.type_of(shared)?;
        if kind != c.type_shared_function_info {
            bail!("{shared:#x} is not a SharedFunctionInfo (type {kind:#x})");
        }
        let name_or_scope = self.field(shared, c.shared_name_or_scope_info)?;
        let (name, start) = if !is_heap_object(name_or_scope) {
            (None, None)
        } else {
            let kind = self.type_of(name_or_scope)?;
            if kind == c.type_scope_info {
                self.scope_info(name_or_scope)
            } else if kind < c.first_nonstring_type {
                (Some(self.string(name_or_scope, MAX_NAME_BYTES)?), None)
            } else {
                (None, None)
            }
        };
        let script = self.field(shared, c.shared_script_or_debug_info)?;
        let (file, line) = match self.script(script) {
            Some(info) => (
                info.name.clone(),
                start.and_then(|pos| line_of(&info.line_ends, pos)),
            ),
            None => (None, None),
        };
        let name = match name {
            Some(n) if !n.is_empty() => n,
            _ => ANONYMOUS.to_string(),
        };
        Ok(JsFunction { name, file, line })
    }

    /// The function's name and start position from its ScopeInfo: a few slots after the
    /// fixed header and the context locals (names and infos), the first string is the name;
    /// the positions are slots 3 and 4 in V8 12.8.44 and later, else the first pair of
    /// ascending Smis after the name. V8 exports no constant for these slots; this is the
    /// layout its versions have kept (as the OpenTelemetry eBPF profiler reads it too).
    fn scope_info(&self, scope_info: u64) -> (Option<String>, Option<u32>) {
        let mut bytes = [0u8; SCOPE_INFO_SLOTS * 8];
        // The slots follow the map.
        if self
            .memory
            .read_exact(scope_info - 1 + 8, &mut bytes)
            .is_err()
        {
            return (None, None);
        }
        let slot = |i: usize| -> u64 {
            let at = i * 8;
            u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
        };
        let mut start = None;
        if self.c.scope_info_fixed_positions {
            start = smi(slot(3)).and_then(|v| u32::try_from(v).ok());
        }
        let locals = self.c.scope_info_context_locals as usize;
        let Some(context_locals) = (locals < SCOPE_INFO_SLOTS)
            .then(|| smi(slot(locals)))
            .flatten()
            .and_then(|n| usize::try_from(n).ok())
        else {
            return (None, start);
        };
        let mut name = None;
        let mut previous: Option<i64> = None;
        let first = (self.c.scope_info_first_vars as usize).saturating_add(2 * context_locals);
        for i in first..SCOPE_INFO_SLOTS {
            let word = slot(i);
            if name.is_none() && is_heap_object(word) {
                if let Ok(kind) = self.type_of(word) {
                    if kind < self.c.first_nonstring_type {
                        name = self.string(word, MAX_NAME_BYTES).ok();
                    }
                }
            }
            if self.c.scope_info_fixed_positions {
                if name.is_some() {
                    break;
                }
                continue;
            }
            let value = smi(word);
            if let (Some(s), Some(e)) = (previous, value) {
                if s < e && s >= 0 {
                    start = u32::try_from(s).ok();
                    break;
                }
            }
            previous = value;
        }
        (name, start)
    }

    /// The script `tagged` (its name and line ends), read once; `None` when it is none (a
    /// function with debug info attached, or a moved object).
    fn script(&mut self, tagged: u64) -> Option<&ScriptInfo> {
        if !self.scripts.contains_key(&tagged) {
            if self.type_of(tagged).ok()? != self.c.type_script {
                return None;
            }
            let name_word = self.field(tagged, self.c.script_name).ok()?;
            let name = self.string(name_word, MAX_NAME_BYTES).ok();
            let line_ends = self.line_ends(tagged).unwrap_or_default();
            self.scripts.insert(tagged, ScriptInfo { name, line_ends });
        }
        self.scripts.get(&tagged)
    }

    /// A script's line ends (source positions of each line's end): its line table when V8
    /// computed one, else counted in its source.
    fn line_ends(&self, script: u64) -> anyhow::Result<Vec<u32>> {
        let table = self.field(script, self.c.script_line_ends)?;
        if is_heap_object(table) && self.type_of(table)? == self.c.type_fixed_array {
            let length = smi(self.field(table, self.c.fixed_array_length)?)
                .ok_or_else(|| anyhow!("line table length is no Smi"))?;
            if length > 0 && (length as u64) <= MAX_LINES {
                let mut bytes = vec![0u8; length as usize * 8];
                self.memory
                    .read_exact(table - 1 + self.c.fixed_array_data, &mut bytes)?;
                return Ok(bytes
                    .chunks_exact(8)
                    .filter_map(|w| smi(u64::from_le_bytes(w.try_into().unwrap_or_default())))
                    .map(|v| v as u32)
                    .collect());
            }
        }
        let source = self.field(script, self.c.script_source)?;
        let text = self.string(source, MAX_SOURCE_BYTES)?;
        Ok(text
            .char_indices()
            .filter(|&(_, ch)| ch == '\n')
            .map(|(i, _)| i as u32)
            .collect())
    }

    /// The string `tagged` points to, up to `limit` bytes.
    pub fn string(&self, tagged: u64, limit: u64) -> anyhow::Result<String> {
        let mut out = Vec::new();
        self.append_string(tagged, 0, u64::MAX, limit, MAX_STRING_DEPTH, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Appends characters `from..from+count` of string `tagged` to `out` (as Latin-1 or UTF-16
    /// decoded to UTF-8), at most `limit` bytes in all.
    fn append_string(
        &self,
        tagged: u64,
        from: u64,
        count: u64,
        limit: u64,
        depth: u32,
        out: &mut Vec<u8>,
    ) -> anyhow::Result<()> {
        let c = &self.c;
        if depth == 0 {
            bail!("string nested too deep");
        }
        let kind = self.type_of(tagged)?;
        if kind >= c.first_nonstring_type {
            bail!("{tagged:#x} is no string (type {kind:#x})");
        }
        let mut len_bytes = [0u8; 4];
        self.memory
            .read_exact(tagged - 1 + c.string_length, &mut len_bytes)?;
        let length = u32::from_le_bytes(len_bytes) as u64;
        let from = from.min(length);
        let count = count.min(length - from);
        let representation = kind & c.string_representation_mask;
        let one_byte = kind & c.string_encoding_mask == c.one_byte_string_tag;
        if representation == c.seq_string_tag {
            let room = limit.saturating_sub(out.len() as u64);
            if one_byte {
                let n = count.min(room);
                let mut bytes = vec![0u8; n as usize];
                self.memory
                    .read_exact(tagged - 1 + c.seq_one_byte_chars + from, &mut bytes)?;
                // Latin-1: each byte is the code point.
                for b in bytes {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(char::from(b).encode_utf8(&mut buf).as_bytes());
                }
            } else {
                let n = count.min(room / 2);
                let mut bytes = vec![0u8; n as usize * 2];
                self.memory
                    .read_exact(tagged - 1 + c.seq_two_byte_chars + 2 * from, &mut bytes)?;
                let units = bytes
                    .chunks_exact(2)
                    .map(|u| u16::from_le_bytes([u[0], u[1]]));
                for ch in char::decode_utf16(units) {
                    let mut buf = [0u8; 4];
                    let ch = ch.unwrap_or(char::REPLACEMENT_CHARACTER);
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
            }
            Ok(())
        } else if representation == c.cons_string_tag {
            let first = self.field(tagged, c.cons_first)?;
            let second = self.field(tagged, c.cons_second)?;
            let mut first_len = [0u8; 4];
            self.memory
                .read_exact(first - 1 + c.string_length, &mut first_len)?;
            let first_len = u32::from_le_bytes(first_len) as u64;
            if from < first_len {
                let n = count.min(first_len - from);
                self.append_string(first, from, n, limit, depth - 1, out)?;
            }
            let end = from + count;
            if end > first_len && (out.len() as u64) < limit {
                let start = from.saturating_sub(first_len);
                let n = end - first_len - start;
                self.append_string(second, start, n, limit, depth - 1, out)?;
            }
            Ok(())
        } else if representation == c.thin_string_tag {
            let actual = self.field(tagged, c.thin_actual)?;
            self.append_string(actual, from, count, limit, depth - 1, out)
        } else if representation == c.sliced_string_tag {
            let parent = self.field(tagged, c.sliced_parent)?;
            let offset = smi(self.field(tagged, c.sliced_offset)?)
                .filter(|&o| o >= 0)
                .ok_or_else(|| anyhow!("sliced string offset is no Smi"))?;
            self.append_string(parent, offset as u64 + from, count, limit, depth - 1, out)
        } else {
            // External strings (Node's own sources) live outside the heap.
            bail!("external or unknown string representation {representation:#x}")
        }
    }
}

/// The 1-based line holding source position `position`, from a script's line ends.
pub fn line_of(line_ends: &[u32], position: u32) -> Option<u32> {
    if line_ends.is_empty() {
        return None;
    }
    let index = line_ends.partition_point(|&end| end < position);
    Some(index as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::line_of;

    #[test]
    fn positions_map_to_lines() {
        // "ab\ncd\nef": line ends at 2 and 5.
        let ends = [2, 5];
        assert_eq!(line_of(&ends, 0), Some(1));
        assert_eq!(line_of(&ends, 2), Some(1));
        assert_eq!(line_of(&ends, 3), Some(2));
        assert_eq!(line_of(&ends, 7), Some(3));
        assert_eq!(line_of(&[], 7), None);
    }
}
