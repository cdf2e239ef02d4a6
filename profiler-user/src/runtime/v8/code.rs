//! A frame's V8 `Code` object: its kind (Sparkplug's baseline code, Maglev's or TurboFan's
//! optimized code) and, for optimized code, the functions inlined at each of its instructions.
//!
//! An optimized function's code holds the code of the functions the compiler inlined into it,
//! and its frame is then the only one on the stack for all of them. V8 keeps what its
//! deoptimizer and stack traces need to tell them apart again, and bpfprof reads the same:
//! - the Code's source position table maps an instruction's offset to a `SourcePosition`
//!   (script offset and an inlining id; [`decode_position_table`]);
//! - its DeoptimizationData holds the inlining positions (for inlining id `n`, entry `n-1`:
//!   the call's own position in its caller, and the index of the inlined function) and, first
//!   in its literal array, the inlined functions' SharedFunctionInfos.
//!
//! Following inlining ids from the instruction's position back to 0 gives the inlined calls,
//! innermost first ([`CodeInfo::inlined_at`]). As everything read from the target, the tables
//! are bounded in size, their objects' types checked, and the chain may only go outward (each
//! id smaller than the last), so that a forged table neither loops nor grows without end.

use anyhow::{anyhow, bail, ensure};

use super::heap::{is_heap_object, smi, Heap};

/// Largest source position table read (bytes): a large optimized function's is a few KiB.
const MAX_POSITION_TABLE_BYTES: u64 = 256 << 10;
/// Most inlined functions read per Code (TurboFan's own budget keeps to tens).
const MAX_INLINED: usize = 1024;
/// Size of one `InliningPosition` (a 64-bit `SourcePosition`, an `int` function index and
/// padding), unchanged since V8 6.
const INLINING_POSITION_BYTES: usize = 16;
/// Deepest chain of inlined calls followed for one instruction.
const MAX_INLINING_DEPTH: usize = 64;
/// Largest instruction size believed for one Code (bytes).
const MAX_INSTRUCTION_BYTES: u64 = 64 << 20;
/// How far before a pc its InstructionStream's header is looked for (bytes): optimized code
/// of a large function is some tens of KiB.
const MAX_STREAM_SCAN: u64 = 1 << 20;
/// Bytes read at once while looking back for an InstructionStream's header.
const SCAN_BLOCK: u64 = 32 << 10;
/// Words read as a map (each a read of the target) per look for a pc's InstructionStream,
/// until the first is found (then the map is known and compared alone).
const MAX_MAP_PROBES: usize = 4096;
/// The smallest mapping's size and alignment.
const PAGE: u64 = 4096;
/// Alignment of an InstructionStream's instructions (V8's `kCodeAlignment` is at least 32 on
/// x86-64).
const CODE_ALIGNMENT: u64 = 32;

/// How V8 compiled a Code object (`CodeKind`), for the frames it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// The interpreter's (a JSFunction not compiled further runs the interpreter's entry).
    Interpreted,
    /// Sparkplug's baseline code.
    Baseline,
    /// Maglev's optimized code.
    Maglev,
    /// TurboFan's optimized code.
    Turbofan,
    /// Any other kind (builtins, stubs, regular expressions).
    Other,
}

impl CodeKind {
    /// The frame kind shown as a JavaScript frame's module.
    pub fn module(self) -> &'static str {
        match self {
            CodeKind::Interpreted => "[js interpreted]",
            CodeKind::Baseline => "[js baseline]",
            CodeKind::Maglev => "[js optimized Maglev]",
            CodeKind::Turbofan => "[js optimized TurboFan]",
            CodeKind::Other => "[js compiled]",
        }
    }

    fn optimized(self) -> bool {
        matches!(self, CodeKind::Maglev | CodeKind::Turbofan)
    }
}

/// A V8 `SourcePosition` (V8's `src/codegen/source-position.h`): bit 0 says the position is
/// external (in no script: line and file ids), else bits 1-30 are the script offset plus
/// one (0: none); bits 31-46 are the inlining id (0: the code's own function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourcePosition(pub u64);

impl SourcePosition {
    /// The inlining id: 0 for the code's own function, else entry `id - 1` of the
    /// inlining positions.
    pub fn inlining_id(self) -> usize {
        ((self.0 >> 31) & 0xffff) as usize
    }

    /// The offset in the script's source, where the position is one.
    pub fn script_offset(self) -> Option<u32> {
        if self.0 & 1 != 0 {
            return None;
        }
        let stored = ((self.0 >> 1) & ((1 << 30) - 1)) as u32;
        stored.checked_sub(1)
    }
}

/// Decodes a source position table (V8's `src/codegen/source-position-table.cc`) into
/// `(code offset, source position)` pairs in code order.
///
/// Each entry is two zigzag-encoded LEB128 numbers, both deltas from the previous entry
/// (which starts at code offset -1, position 0): the code offset's delta, negated minus one
/// where the entry is not a statement position, then the source position's delta. A number
/// over 64 bits, an offset over 32, or a table that ends inside a number, is an error.
pub fn decode_position_table(bytes: &[u8]) -> anyhow::Result<Vec<(u32, SourcePosition)>> {
    let mut reader = gimli::EndianSlice::new(bytes, gimli::LittleEndian);
    let read = |reader: &mut gimli::EndianSlice<gimli::LittleEndian>| -> anyhow::Result<i64> {
        let raw =
            gimli::leb128::read::unsigned(reader).map_err(|e| anyhow!("position table: {e}"))?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    };
    let mut out = Vec::new();
    let (mut code, mut position) = (-1i64, 0i64);
    while !reader.is_empty() {
        let delta = read(&mut reader)?;
        // A non-statement entry's delta is stored as -delta - 1.
        let delta = if delta >= 0 { delta } else { -(delta + 1) };
        code = code
            .checked_add(delta)
            .ok_or_else(|| anyhow!("position table overflows"))?;
        position = position.wrapping_add(read(&mut reader)?);
        let code = u32::try_from(code).map_err(|_| anyhow!("code offset {code} out of range"))?;
        out.push((code, SourcePosition(position as u64)));
    }
    Ok(out)
}

/// The entries of an inlining positions table (V8's `InliningPosition`s, 16 bytes each: the
/// call's `SourcePosition` in its caller, the inlined function's index in the inlined
/// functions, padding); a partial entry at the end is left out.
pub fn parse_inlining_positions(bytes: &[u8]) -> Vec<(SourcePosition, i32)> {
    bytes
        .chunks_exact(INLINING_POSITION_BYTES)
        .map(|e| {
            let mut position = [0u8; 8];
            position.copy_from_slice(&e[0..8]);
            let mut function = [0u8; 4];
            function.copy_from_slice(&e[8..12]);
            (
                SourcePosition(u64::from_le_bytes(position)),
                i32::from_le_bytes(function),
            )
        })
        .collect()
}

/// One function of an inlined call chain: its SharedFunctionInfo (tagged), and the script
/// offset it was at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inlined {
    /// The function's SharedFunctionInfo (tagged; 0 where the table named none).
    pub shared: u64,
    /// Where in its script the instruction, or the call to the next function, is.
    pub script_offset: Option<u32>,
}

/// What bpfprof keeps of one Code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// Its kind.
    pub kind: CodeKind,
    /// Its instructions' start address.
    pub start: u64,
    /// Its instructions' size.
    pub size: u64,
    /// Its source positions by code offset (optimized code only).
    pub positions: Vec<(u32, SourcePosition)>,
    /// Its inlining positions: the call's position in its caller, the inlined function's
    /// index in `inlined` (optimized code that inlined anything only).
    pub inlining: Vec<(SourcePosition, i32)>,
    /// The inlined functions' SharedFunctionInfos (tagged; 0 where one could not be read).
    pub inlined: Vec<u64>,
}

impl CodeInfo {
    /// Whether `pc` lies in its instructions.
    pub fn contains(&self, pc: u64) -> bool {
        pc >= self.start && pc - self.start < self.size
    }

    /// Bytes it keeps, to charge to its owner's naming share.
    pub fn kept_bytes(&self) -> u64 {
        (std::mem::size_of::<Self>()
            + self.positions.len() * std::mem::size_of::<(u32, SourcePosition)>()
            + self.inlining.len() * std::mem::size_of::<(SourcePosition, i32)>()
            + self.inlined.len() * 8) as u64
    }

    /// The functions running at `pc` (in its instructions), innermost first, the last the
    /// code's own (`own`): one for code that inlined nothing there. `return_address` says `pc`
    /// is a caller's return address (every frame but the sampled one), which is looked up
    /// one byte back, in the call instruction. `None` where `pc` is not in the code or the
    /// tables do not hold together.
    pub fn inlined_at(&self, pc: u64, return_address: bool, own: u64) -> Option<Vec<Inlined>> {
        if !self.contains(pc) {
            return None;
        }
        let mut offset = pc - self.start;
        if return_address && offset > 0 {
            offset -= 1;
        }
        // The last entry at or before the offset.
        let at = self
            .positions
            .partition_point(|&(code, _)| u64::from(code) <= offset);
        let mut position = match at {
            0 => SourcePosition(0),
            n => self.positions[n - 1].1,
        };
        let mut out = Vec::new();
        while position.inlining_id() != 0 {
            let id = position.inlining_id();
            let &(caller, function) = self.inlining.get(id - 1)?;
            // A negative index names the code's own function.
            let shared = match usize::try_from(function) {
                Ok(f) => *self.inlined.get(f)?,
                Err(_) => own,
            };
            out.push(Inlined {
                shared,
                script_offset: position.script_offset(),
            });
            // Each call is inlined into one inlined before it: ids only go down, and a table
            // that says otherwise is not believed.
            if caller.inlining_id() >= id || out.len() >= MAX_INLINING_DEPTH {
                return None;
            }
            position = caller;
        }
        out.push(Inlined {
            shared: own,
            script_offset: position.script_offset(),
        });
        Some(out)
    }
}

/// Bytes as hex digits (for a trace of the tables read).
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Heap {
    /// Reads the Code object `tagged` (a frame's function's code, as the kernel recorded it):
    /// its kind and instructions, and for optimized code its positions and inlining.
    pub fn code(&self, tagged: u64) -> anyhow::Result<CodeInfo> {
        let Some(cc) = self.c.code.as_ref() else {
            bail!("this V8 exports no Code layout");
        };
        let kind = self.type_of(tagged)?;
        ensure!(
            kind == cc.type_code,
            "{tagged:#x} is no Code (type {kind:#x})"
        );
        let start = self.field(tagged, cc.instruction_start)?;
        let mut four = [0u8; 4];
        self.memory
            .read_exact((tagged - 1).wrapping_add(cc.instruction_size), &mut four)?;
        let size = u64::from(u32::from_le_bytes(four));
        ensure!(
            size > 0 && size <= MAX_INSTRUCTION_BYTES,
            "Code {tagged:#x} has {size} bytes of instructions"
        );
        self.memory
            .read_exact((tagged - 1).wrapping_add(cc.flags), &mut four)?;
        let value = (u32::from_le_bytes(four) >> cc.kind_shift) & cc.kind_mask;
        let kind = match value {
            v if v == cc.kind_interpreted => CodeKind::Interpreted,
            v if v == cc.kind_baseline => CodeKind::Baseline,
            // MAGLEV and TURBOFAN_JS follow BASELINE in V8's CodeKind.
            v if v == cc.kind_baseline + 1 => CodeKind::Maglev,
            v if v == cc.kind_baseline + 2 => CodeKind::Turbofan,
            _ => CodeKind::Other,
        };
        let mut info = CodeInfo {
            kind,
            start,
            size,
            positions: Vec::new(),
            inlining: Vec::new(),
            inlined: Vec::new(),
        };
        if !kind.optimized() {
            return Ok(info);
        }
        let table = self.field(tagged, cc.position_table)?;
        let bytes = self.byte_array(table, MAX_POSITION_TABLE_BYTES)?;
        info.positions = decode_position_table(&bytes)?;
        let deopt = self.field(tagged, cc.deoptimization_data)?;
        let last = cc
            .deopt_inlined_count
            .max(cc.deopt_literal_array)
            .max(cc.deopt_inlining_positions);
        let slots = self.fixed_array(deopt, last as usize + 1)?;
        ensure!(
            slots.len() > last as usize,
            "DeoptimizationData of {tagged:#x} is too short"
        );
        let count = smi(slots[cc.deopt_inlined_count as usize])
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= MAX_INLINED)
            .ok_or_else(|| anyhow!("inlined function count of {tagged:#x} is out of range"))?;
        if count == 0 {
            return Ok(info);
        }
        let literals = self.fixed_array(slots[cc.deopt_literal_array as usize], count)?;
        ensure!(
            literals.len() >= count,
            "literal array shorter than its inlined functions"
        );
        info.inlined = literals.iter().map(|&l| self.shared_of(l)).collect();
        let positions = self.byte_array(
            slots[cc.deopt_inlining_positions as usize],
            (MAX_INLINED * INLINING_POSITION_BYTES) as u64,
        )?;
        log::trace!(
            "V8 code {tagged:#x} at {start:#x}+{size:#x}: position table {}, inlining positions \
             {}, {count} inlined",
            hex(&bytes),
            hex(&positions)
        );
        info.inlining = parse_inlining_positions(&positions);
        Ok(info)
    }

    /// The Code object whose instructions hold `pc` (tagged), found from the instructions:
    /// V8 puts an InstructionStream header (its map, its Code, ...) right before each code's
    /// instructions, aligned, so the nearest such header before `pc` whose Code points back
    /// to it and whose instructions cover `pc` is `pc`'s. V8 13's JSFunction keeps no Code
    /// (a dispatch table handle instead), and a frame in on-stack replacement code runs code
    /// no function holds: the pc is what every optimized frame has.
    ///
    /// Bounded: at most [`MAX_STREAM_SCAN`] bytes before `pc` are read, in blocks, stopping
    /// where the memory cannot be read; a header is believed only when its Code, type-checked,
    /// points back to it and covers `pc`.
    pub fn code_at(&mut self, pc: u64) -> anyhow::Result<u64> {
        let Some(cc) = self.c.code.as_ref() else {
            bail!("this V8 exports no Code layout");
        };
        let header = cc.stream_instruction_start;
        let lowest = pc.saturating_sub(MAX_STREAM_SCAN);
        // The instructions start aligned, `header` bytes after their stream: the candidates
        // are the aligned addresses at or below `pc`, less the header, downwards.
        let Some(mut stream) = (pc & !(CODE_ALIGNMENT - 1)).checked_sub(header) else {
            bail!("pc {pc:#x} is too low");
        };
        let (mut block, mut block_from) = (Vec::new(), u64::MAX);
        let mut probes = 0;
        while stream >= lowest {
            if stream < block_from {
                let end = stream + 8;
                let from = end.saturating_sub(SCAN_BLOCK).max(lowest);
                block = vec![0u8; (end - from) as usize];
                let mut read = self.memory.read_exact(from, &mut block).is_ok();
                if !read {
                    // The mapping may start inside the block: its last page alone.
                    let from = from.max((end - 8) & !(PAGE - 1));
                    block = vec![0u8; (end - from) as usize];
                    read = self.memory.read_exact(from, &mut block).is_ok();
                    block_from = from;
                } else {
                    block_from = from;
                }
                if !read {
                    bail!("no InstructionStream before {pc:#x} in readable memory");
                }
            }
            let i = (stream - block_from) as usize;
            let word = u64::from_le_bytes(block[i..i + 8].try_into().unwrap_or_default());
            let is_map = match self.stream_map {
                Some(map) => word == map,
                None if is_heap_object(word) => {
                    probes += 1;
                    ensure!(
                        probes <= MAX_MAP_PROBES,
                        "no InstructionStream map among {MAX_MAP_PROBES} words before {pc:#x}"
                    );
                    self.type_of_map(word).ok() == Some(cc.type_instruction_stream)
                }
                None => false,
            };
            if is_map {
                if let Some(code) = self.code_of_stream(stream, pc) {
                    self.stream_map = Some(word);
                    return Ok(code);
                }
            }
            let Some(next) = stream.checked_sub(CODE_ALIGNMENT) else {
                break;
            };
            stream = next;
        }
        bail!("no InstructionStream within {MAX_STREAM_SCAN} bytes before {pc:#x}")
    }

    /// The instance type a map (`map`, tagged) gives its objects.
    fn type_of_map(&self, map: u64) -> anyhow::Result<u16> {
        let mut b = [0u8; 2];
        self.memory
            .read_exact((map - 1).wrapping_add(self.c.map_instance_type), &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// The Code of the InstructionStream at `stream` (untagged) when one of its header's words
    /// is a Code that points back to it, whose instructions start right after the header and
    /// cover `pc`.
    fn code_of_stream(&self, stream: u64, pc: u64) -> Option<u64> {
        let cc = self.c.code.as_ref()?;
        let header = cc.stream_instruction_start;
        let mut bytes = vec![0u8; header as usize];
        self.memory.read_exact(stream, &mut bytes).ok()?;
        bytes.chunks_exact(8).skip(1).find_map(|w| {
            let code = u64::from_le_bytes(w.try_into().unwrap_or_default());
            if !is_heap_object(code) || self.type_of(code).ok()? != cc.type_code {
                return None;
            }
            let back = self.field(code, cc.instruction_stream).ok()?;
            let start = self.field(code, cc.instruction_start).ok()?;
            let mut four = [0u8; 4];
            self.memory
                .read_exact((code - 1).wrapping_add(cc.instruction_size), &mut four)
                .ok()?;
            let size = u64::from(u32::from_le_bytes(four));
            (back == stream + 1 && start == stream + header && pc >= start && pc - start < size)
                .then_some(code)
        })
    }

    /// The SharedFunctionInfo a literal names (itself, or the one its wrapper holds; weak
    /// references followed), 0 when it names none.
    fn shared_of(&self, literal: u64) -> u64 {
        // A weak reference is a heap object's pointer with bit 1 set as well.
        let literal = if literal & 3 == 3 {
            literal & !2
        } else {
            literal
        };
        let Ok(kind) = self.type_of(literal) else {
            return 0;
        };
        if kind == self.c.type_shared_function_info {
            return literal;
        }
        let Some(cc) = self.c.code.as_ref() else {
            return 0;
        };
        if Some(kind) == cc.type_shared_function_info_wrapper {
            if let Ok(inner) = self.field(literal, cc.wrapper_shared_info) {
                if self.type_of(inner).ok() == Some(self.c.type_shared_function_info) {
                    return inner;
                }
            }
        }
        0
    }

    /// The length of array `tagged` once its type is one of `types` (the byte or the fixed
    /// arrays' types of the Code layout): `None` when its length slot holds no Smi that fits.
    fn array_length(
        &self,
        tagged: u64,
        types: impl Fn(&super::detect::CodeConstants) -> &[u16],
        what: &str,
    ) -> anyhow::Result<Option<u64>> {
        let cc = self
            .c
            .code
            .as_ref()
            .ok_or_else(|| anyhow!("no Code layout"))?;
        let kind = self.type_of(tagged)?;
        ensure!(
            types(cc).contains(&kind),
            "{tagged:#x} is no {what} (type {kind:#x})"
        );
        Ok(smi(self.field(tagged, self.c.fixed_array_length)?).and_then(|n| u64::try_from(n).ok()))
    }

    /// The bytes of byte array `tagged` (plain or trusted), at most `limit`.
    fn byte_array(&self, tagged: u64, limit: u64) -> anyhow::Result<Vec<u8>> {
        let length = self
            .array_length(tagged, |cc| &cc.types_byte_array, "byte array")?
            .filter(|&n| n <= limit)
            .ok_or_else(|| anyhow!("byte array {tagged:#x} has no length up to {limit}"))?;
        let mut bytes = vec![0u8; length as usize];
        self.memory.read_exact(
            (tagged - 1).wrapping_add(self.c.fixed_array_data),
            &mut bytes,
        )?;
        Ok(bytes)
    }

    /// The first `want` (or fewer, where it is shorter) slots of fixed array `tagged` (any of
    /// V8's fixed arrays: plain, weak, trusted or protected, which share one layout).
    fn fixed_array(&self, tagged: u64, want: usize) -> anyhow::Result<Vec<u64>> {
        let length = self
            .array_length(tagged, |cc| &cc.types_fixed_array, "fixed array")?
            .ok_or_else(|| anyhow!("fixed array {tagged:#x} has no length"))?;
        let n = usize::try_from(length).map_or(want, |l| l.min(want));
        let mut bytes = vec![0u8; n * 8];
        self.memory.read_exact(
            (tagged - 1).wrapping_add(self.c.fixed_array_data),
            &mut bytes,
        )?;
        Ok(bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::runtime::v8::heap::line_of;

    /// The capture of `testdata/node24_osr_code.txt` (see its header).
    struct Capture {
        code: CodeInfo,
        own: u64,
        names: HashMap<u64, String>,
        frames: Vec<(u64, u16)>,
    }

    fn hex_bytes(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn number(text: &str) -> u64 {
        u64::from_str_radix(text.trim_start_matches("0x"), 16).unwrap()
    }

    fn capture() -> Capture {
        let text = include_str!("testdata/node24_osr_code.txt");
        let mut fields: HashMap<&str, &str> = HashMap::new();
        let mut names = HashMap::new();
        let mut frames = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (key, value) = line.split_once(' ').unwrap();
            match key {
                "function" => {
                    let (address, name) = value.split_once(' ').unwrap();
                    names.insert(number(address), name.to_string());
                }
                "frame" => {
                    let (pc, index) = value.split_once(' ').unwrap();
                    frames.push((number(pc), index.parse().unwrap()));
                }
                _ => {
                    fields.insert(key, value);
                }
            }
        }
        let code = CodeInfo {
            kind: CodeKind::Turbofan,
            start: number(fields["start"]),
            size: number(fields["size"]),
            positions: decode_position_table(&hex_bytes(fields["positions"])).unwrap(),
            inlining: parse_inlining_positions(&hex_bytes(fields["inlining"])),
            inlined: fields["inlined"].split(',').map(number).collect(),
        };
        Capture {
            code,
            own: number(fields["own"]),
            names,
            frames,
        }
    }

    /// The 1-based lines of `function NAME(`'s body in nodehot.js: from the line after its
    /// `function` line to its closing brace.
    fn body(script: &str, name: &str) -> std::ops::RangeInclusive<u32> {
        let lines: Vec<&str> = script.lines().collect();
        let first = lines
            .iter()
            .position(|l| l.starts_with(&format!("function {name}(")))
            .unwrap();
        let last = (first..lines.len()).find(|&i| lines[i] == "}").unwrap();
        (first as u32 + 2)..=(last as u32)
    }

    #[test]
    fn position_table_decodes_zigzag_leb128_deltas() {
        // Code offset +5 (a statement: 10 zigzag), source +100 (200 = c8 01); then offset
        // +3 not a statement (stored -4: 7 zigzag), source -30 (59 zigzag).
        let table = [10, 0xc8, 0x01, 7, 59];
        let decoded = decode_position_table(&table).unwrap();
        assert_eq!(
            decoded,
            [(4, SourcePosition(100)), (7, SourcePosition(70))],
            "offsets start at -1 and positions at 0"
        );
        // A number cut short, and one that overflows 64 bits, are errors, not panics.
        assert!(decode_position_table(&[10, 0xc8]).is_err());
        assert!(decode_position_table(&[0xff; 16]).is_err());
    }

    /// Node 24's own tables: every recorded frame in the code expands to a chain of the
    /// script's functions, the code's own outermost, each at a line in its body where it
    /// calls the next (or runs, for the innermost); the hot loops show as hotA and hotB inlined
    /// under level3, level2 and level1, as the script calls them.
    #[test]
    fn node24_inlined_frames_follow_the_scripts_calls() {
        let capture = capture();
        let script = include_str!("testdata/nodehot.js");
        let line_ends: Vec<u32> = script
            .char_indices()
            .filter(|&(_, c)| c == '\n')
            .map(|(i, _)| i as u32)
            .collect();
        assert!(capture.code.positions.len() > 50);
        let calls: HashMap<&str, &str> = [
            ("hotA", "level3"),
            ("hotB", "level3"),
            ("level3", "level2"),
            ("level2", "level1"),
            ("level1", "(anonymous)"),
        ]
        .into();
        let mut deepest = HashMap::new();
        for &(pc, index) in &capture.frames {
            let chain = capture
                .code
                .inlined_at(pc, index > 0, capture.own)
                .unwrap_or_else(|| panic!("no chain at {pc:#x}"));
            assert_eq!(chain.last().unwrap().shared, capture.own);
            let named: Vec<(&str, u32)> = chain
                .iter()
                .map(|f| {
                    let name = capture.names.get(&f.shared).map_or("?", String::as_str);
                    let line = line_of(&line_ends, f.script_offset.unwrap()).unwrap();
                    (name, line)
                })
                .collect();
            // Innermost first: each function's caller is the next, as the script has it.
            for pair in named.windows(2) {
                let (callee, caller) = (pair[0].0, pair[1].0);
                if let Some(&expected) = calls.get(callee) {
                    assert_eq!(caller, expected, "{named:?} at {pc:#x}");
                }
            }
            for &(name, line) in &named {
                if name != "(anonymous)" && name != "?" {
                    assert!(body(script, name).contains(&line), "{named:?} at {pc:#x}");
                }
            }
            let depth = deepest.entry(named[0].0).or_insert(0);
            *depth = (*depth).max(named.len());
        }
        // The hot loops, five deep: hotA or hotB, level3, level2, level1, the script.
        assert_eq!(deepest.get("hotA"), Some(&5), "{deepest:?}");
        assert_eq!(deepest.get("hotB"), Some(&5), "{deepest:?}");
    }

    #[test]
    fn forged_inlining_tables_neither_loop_nor_panic() {
        let position = |offset: u64, id: u64| SourcePosition(((offset + 1) << 1) | (id << 31));
        let mut code = CodeInfo {
            kind: CodeKind::Turbofan,
            start: 0x1000,
            size: 0x100,
            positions: vec![(0, position(5, 1))],
            // Entry 1 says its caller is itself: a loop.
            inlining: vec![(position(3, 1), 0)],
            inlined: vec![0x11],
        };
        assert_eq!(code.inlined_at(0x1010, false, 0x21), None);
        // A caller with a higher id, a function index out of range, an id with no entry.
        code.inlining = vec![(position(3, 2), 0), (position(3, 0), 0)];
        assert_eq!(code.inlined_at(0x1010, false, 0x21), None);
        code.inlining = vec![(position(3, 0), 7)];
        assert_eq!(code.inlined_at(0x1010, false, 0x21), None);
        code.inlining = Vec::new();
        assert_eq!(code.inlined_at(0x1010, false, 0x21), None);
        // Outside the code: no chain; a good one: inlined, then the code's own.
        code.inlining = vec![(position(3, 0), 0)];
        assert_eq!(code.inlined_at(0x2000, false, 0x21), None);
        let chain = code.inlined_at(0x1010, true, 0x21).unwrap();
        let sfis: Vec<u64> = chain.iter().map(|f| f.shared).collect();
        assert_eq!(sfis, [0x11, 0x21]);
        assert_eq!(chain[0].script_offset, Some(5));
        assert_eq!(chain[1].script_offset, Some(3));
        // A partial inlining entry is left out.
        assert_eq!(parse_inlining_positions(&[0u8; 31]).len(), 1);
    }
}
