//! A JVM's code cache: its code heaps, the code blobs in them (compiled methods, the
//! interpreter, stubs), the unwind rows of their frames and the `Method*` of each compiled
//! method, read through the layout [`super::vmstructs`] gives.
//!
//! A heap is a run of blocks (a `HeapBlock` header, then the blob), each as long as its
//! header says in segments; the used part of a heap is read in chunks and walked block by
//! block. Everything read is the target's to fake: sizes are bounded, a block that does not
//! fit ends the heap's walk, and the rows made from it can only misdirect this process's own
//! walk (the kernel bounds every walk).

use anyhow::{anyhow, Context};
use profiler_common::{CfaRule, HotspotProcess, UnwindRow};

use super::vmstructs::VmStructs;
use crate::runtime::cpython::memory::ProcessMemory;

/// Bytes of code heaps read per scan at most: the rest is left unwalked (and said).
pub const MAX_SCAN_BYTES: u64 = 256 << 20;
/// Bytes read at once while walking a heap.
const CHUNK: u64 = 1 << 20;
/// Code heaps one JVM has at most (JDK 9+: non-nmethods, profiled, non-profiled).
const MAX_HEAPS: usize = 8;
/// Blobs one scan keeps at most.
pub const MAX_BLOBS: usize = 1 << 20;

/// Where a JVM keeps what bpfprof reads, from its `VMStructs`.
#[derive(Clone, Debug)]
pub struct Layout {
    heaps: u64,
    low_bound: u64,
    high_bound: u64,
    array_len: u64,
    array_data: u64,
    heap_memory: u64,
    heap_log2_segment: u64,
    space_low: u64,
    space_high: u64,
    block_size: u64,
    block_length: u64,
    /// Bytes of `HeapBlock::Header::_length` (8 to JDK 22, 4 since).
    block_length_width: usize,
    block_used: u64,
    blob_name: u64,
    blob_frame_size: u64,
    blob_frame_complete: u64,
    /// Bytes of `_frame_complete_offset` (4 to JDK 22, 2 since).
    blob_frame_complete_width: usize,
    /// JDK 17: `_code_begin` and `_code_end` pointers; JDK 23+: offsets from the blob.
    blob_code: CodeBounds,
    nmethod_method: u64,
    nmethod_compile_id: u64,
    nmethod_comp_level: u64,
    nmethod_entry_bci: u64,
    /// Where an interpreter frame keeps its `Method*`, in bytes from rbp.
    pub method_at: i64,
    /// Where it keeps its sender sp, in bytes from rbp.
    pub sender_sp_at: i64,
    /// Where methods keep their names.
    pub names: super::names::NameLayout,
    /// Where compiled methods keep their inlining (`None`: this JVM's is not read).
    pub inlining: Option<InlineLayout>,
}

/// Where a compiled method keeps which methods it inlined at each pc: its `PcDesc`s (pc
/// offset, scope offset), the scopes they point to in its scopes data (a compressed stream:
/// caller scope, method index, bci, ...), and the metadata table the method indexes are into.
#[derive(Clone, Debug)]
pub struct InlineLayout {
    /// Where the tables are.
    tables: InlineTables,
    /// `sizeof(PcDesc)`.
    pub pc_desc_size: u64,
    /// `PcDesc::_pc_offset`.
    pub pc_desc_pc: u64,
    /// `PcDesc::_scope_decode_offset`.
    pub pc_desc_scope: u64,
    /// What each byte of the scopes' compressed ints is counted from: 0 to JDK 19, 1 since
    /// JDK 20 (JDK-8292758's UNSIGNED5, which never writes a zero byte).
    unsigned5_base: u32,
}

/// A nmethod field: its offset in the nmethod and its width in bytes.
#[derive(Clone, Copy, Debug)]
struct Member {
    at: u64,
    width: usize,
}

impl Member {
    fn new(vm: &VmStructs, type_name: &str, field: &str) -> anyhow::Result<Member> {
        Ok(Member {
            at: vm.offset(type_name, field)?,
            width: vm.width(type_name, field),
        })
    }

    /// The field's value in the nmethod at `header`, an unsigned integer of its width.
    fn read(self, memory: &ProcessMemory, header: u64) -> anyhow::Result<u64> {
        let width = self.width.min(8);
        let bytes = memory.read_vec(header + self.at, width)?;
        let mut word = [0u8; 8];
        word[..width].copy_from_slice(&bytes);
        Ok(u64::from_le_bytes(word))
    }
}

/// Where the tables of a compiled method are, by JDK.
#[derive(Clone, Debug)]
enum InlineTables {
    /// To JDK 22, inside the nmethod: the `PcDesc`s from `_scopes_pcs_offset` to
    /// `_dependencies_offset`, the metadata at `_metadata_offset` (offsets from its start),
    /// the scopes data at the pointer `_scopes_data_begin`.
    InBlob {
        metadata: Member,
        scopes_pcs: Member,
        dependencies: Member,
        scopes_data_begin: u64,
    },
    /// JDK 23 on (JDK-8331087), in the nmethod's immutable data (a pointer): the `PcDesc`s
    /// from `_scopes_pcs_offset` to `_scopes_data_offset`, the scopes data from there; the
    /// metadata as [`Metadata`] says.
    Immutable {
        immutable_data: u64,
        scopes_pcs: Member,
        scopes_data: Member,
        metadata: Metadata,
    },
}

/// Where a JDK 23+ compiled method's metadata table is.
#[derive(Clone, Debug)]
enum Metadata {
    /// JDK 23 and 24: `_metadata_offset` past the blob's `_data_offset`.
    InData { data: Member, metadata: Member },
    /// JDK 25 on (JDK-8343789): `_relocation_size` past the blob's mutable data (a pointer,
    /// `_mutable_data`): the relocations, then the metadata.
    Mutable {
        mutable_data: u64,
        relocation_size: Member,
    },
}

impl InlineLayout {
    fn new(vm: &VmStructs, memory: &ProcessMemory) -> anyhow::Result<InlineLayout> {
        let tables = match vm.offset("nmethod", "_immutable_data") {
            Err(_) => InlineTables::InBlob {
                metadata: Member::new(vm, "nmethod", "_metadata_offset")?,
                scopes_pcs: Member::new(vm, "nmethod", "_scopes_pcs_offset")?,
                dependencies: Member::new(vm, "nmethod", "_dependencies_offset")?,
                scopes_data_begin: vm.offset_of_any(&[
                    ("CompiledMethod", "_scopes_data_begin"),
                    ("nmethod", "_scopes_data_begin"),
                ])?,
            },
            Ok(immutable_data) => InlineTables::Immutable {
                immutable_data,
                scopes_pcs: Member::new(vm, "nmethod", "_scopes_pcs_offset")?,
                scopes_data: Member::new(vm, "nmethod", "_scopes_data_offset")?,
                metadata: match vm.offset("CodeBlob", "_mutable_data") {
                    Ok(mutable_data) => Metadata::Mutable {
                        mutable_data,
                        relocation_size: Member::new(vm, "CodeBlob", "_relocation_size")?,
                    },
                    Err(_) => Metadata::InData {
                        data: Member::new(vm, "CodeBlob", "_data_offset")?,
                        metadata: Member::new(vm, "nmethod", "_metadata_offset")?,
                    },
                },
            },
        };
        // The JDK's major version, where VMStructs gives it; without it, the immutable
        // data's layout (JDK 23+) says the encoding is JDK 20's.
        let major = vm
            .address("Abstract_VM_Version", "_vm_major_version")
            .ok()
            .and_then(|at| memory.read_i32(at).ok());
        let unsigned5_base = match (major, &tables) {
            (Some(major), _) if (1..1000).contains(&major) => u32::from(major >= 20),
            (_, InlineTables::Immutable { .. }) => 1,
            (_, InlineTables::InBlob { .. }) => {
                return Err(anyhow!("no JDK version to read the scopes' encoding by"))
            }
        };
        Ok(InlineLayout {
            tables,
            pc_desc_size: vm.size("PcDesc")?,
            pc_desc_pc: vm.offset("PcDesc", "_pc_offset")?,
            pc_desc_scope: vm.offset("PcDesc", "_scope_decode_offset")?,
            unsigned5_base,
        })
    }

    /// The compiled method at `header`'s `PcDesc`s (begin, end), scopes data and metadata
    /// table, as addresses.
    fn tables(&self, memory: &ProcessMemory, header: u64) -> anyhow::Result<[u64; 4]> {
        // Each offset is checked for a plausible size before it is added: they are the
        // target's numbers.
        let offset = |m: Member| -> anyhow::Result<u64> {
            let o = m.read(memory, header)?;
            if o >= 1 << 31 {
                return Err(anyhow!("implausible table offset {o:#x}"));
            }
            Ok(o)
        };
        Ok(match &self.tables {
            InlineTables::InBlob {
                metadata,
                scopes_pcs,
                dependencies,
                scopes_data_begin,
            } => [
                header + offset(*scopes_pcs)?,
                header + offset(*dependencies)?,
                memory.read_u64(header + scopes_data_begin)?,
                header + offset(*metadata)?,
            ],
            InlineTables::Immutable {
                immutable_data,
                scopes_pcs,
                scopes_data,
                metadata,
            } => {
                let data = memory.read_u64(header + immutable_data)?;
                let scopes = data.wrapping_add(offset(*scopes_data)?);
                let metadata = match metadata {
                    Metadata::InData { data, metadata } => {
                        header + offset(*data)? + offset(*metadata)?
                    }
                    Metadata::Mutable {
                        mutable_data,
                        relocation_size,
                    } => memory
                        .read_u64(header + mutable_data)?
                        .wrapping_add(offset(*relocation_size)?),
                };
                [
                    data.wrapping_add(offset(*scopes_pcs)?),
                    scopes,
                    scopes,
                    metadata,
                ]
            }
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum CodeBounds {
    Pointers { begin: u64, end: u64 },
    Offsets { begin: u64, end: u64 },
}

impl Layout {
    /// The layout `vm` describes; an error names what is missing.
    pub fn new(vm: &VmStructs, memory: &ProcessMemory) -> anyhow::Result<Layout> {
        let blob_code = match (
            vm.offset("CodeBlob", "_code_begin"),
            vm.offset("CodeBlob", "_code_end"),
        ) {
            (Ok(begin), Ok(end)) => CodeBounds::Pointers { begin, end },
            _ => CodeBounds::Offsets {
                begin: vm.offset("CodeBlob", "_code_offset")?,
                end: vm.offset("CodeBlob", "_data_offset")?,
            },
        };
        // x86-64's frame layout: the sender sp one word below rbp, the last sp below it, the
        // `Method*` below that (`frame::interpreter_frame_method_offset` is not exported, but
        // has followed the last sp on x86-64 since JDK 7).
        let sender_sp = vm
            .int("frame::interpreter_frame_sender_sp_offset")
            .ok_or_else(|| anyhow!("VMStructs has no interpreter frame layout"))?;
        let last_sp = vm
            .int("frame::interpreter_frame_last_sp_offset")
            .ok_or_else(|| anyhow!("VMStructs has no interpreter frame layout"))?;
        if !(-16..0).contains(&sender_sp) || !(-16..0).contains(&last_sp) {
            return Err(anyhow!(
                "implausible interpreter frame layout ({sender_sp}, {last_sp})"
            ));
        }
        Ok(Layout {
            heaps: vm.address("CodeCache", "_heaps")?,
            low_bound: vm.address("CodeCache", "_low_bound")?,
            high_bound: vm.address("CodeCache", "_high_bound")?,
            array_len: vm.offset("GrowableArrayBase", "_len")?,
            array_data: vm.offset("GrowableArray<int>", "_data")?,
            heap_memory: vm.offset("CodeHeap", "_memory")?,
            heap_log2_segment: vm.offset("CodeHeap", "_log2_segment_size")?,
            space_low: vm.offset("VirtualSpace", "_low")?,
            space_high: vm.offset("VirtualSpace", "_high")?,
            block_size: vm.size("HeapBlock")?,
            block_length: vm.offset("HeapBlock::Header", "_length")?,
            block_length_width: vm.width("HeapBlock::Header", "_length"),
            block_used: vm.offset("HeapBlock::Header", "_used")?,
            blob_name: vm.offset("CodeBlob", "_name")?,
            blob_frame_size: vm.offset("CodeBlob", "_frame_size")?,
            blob_frame_complete: vm.offset("CodeBlob", "_frame_complete_offset")?,
            blob_frame_complete_width: vm.width("CodeBlob", "_frame_complete_offset"),
            blob_code,
            nmethod_method: vm
                .offset_of_any(&[("CompiledMethod", "_method"), ("nmethod", "_method")])?,
            nmethod_compile_id: vm.offset("nmethod", "_compile_id")?,
            nmethod_comp_level: vm.offset("nmethod", "_comp_level")?,
            nmethod_entry_bci: vm.offset("nmethod", "_entry_bci")?,
            method_at: 8 * (last_sp as i64 - 1),
            sender_sp_at: 8 * sender_sp as i64,
            names: super::names::NameLayout::new(vm)?,
            inlining: InlineLayout::new(vm, memory)
                .map_err(|e| log::debug!("no inlining: {e:#}"))
                .ok(),
        })
    }
}

/// What a blob is, as far as naming and unwinding go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// The template interpreter (and its native method entries): rbp frames with the
    /// `Method*` in them.
    Interpreter,
    /// A compiled method (C1, C2, a native wrapper).
    Compiled {
        /// Its `Method*`.
        method: u64,
        /// The compilation's id, unique in the JVM's life: what tells a method's code from
        /// the code that later took its place.
        compile_id: i32,
        /// 1-3 C1, 4 C2, 0 a native wrapper.
        level: i32,
        /// The bci of an on-stack-replacement compile, -1 for a normal one.
        entry_bci: i32,
    },
    /// Any other code: stubs, adapters (by the blob's name).
    Stub(String),
}

/// One code blob.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blob {
    /// Where it starts (its header).
    pub header: u64,
    /// Its first instruction.
    pub code_begin: u64,
    /// One past its last.
    pub code_end: u64,
    /// Its frame's size in bytes once set up (0: no frame of its own, or unknown).
    pub frame_bytes: u64,
    /// Offset from `code_begin` where the frame is set up (-1: never).
    pub frame_complete: i32,
    /// What it is.
    pub kind: BlobKind,
}

/// One scan of the code cache.
#[derive(Debug, Default)]
pub struct Scan {
    /// The code cache's reserved range.
    pub bounds: (u64, u64),
    /// Its blobs, by `code_begin`.
    pub blobs: Vec<Blob>,
    /// Whether a bound cut the scan.
    pub cut: bool,
}

impl Scan {
    /// The blob holding `pc`.
    pub fn blob_at(&self, pc: u64) -> Option<&Blob> {
        let i = self.blobs.partition_point(|b| b.code_begin <= pc);
        let blob = self.blobs.get(i.checked_sub(1)?)?;
        (pc < blob.code_end).then_some(blob)
    }

    /// What the kernel needs for this JVM.
    pub fn kernel_process(&self, layout: &Layout) -> HotspotProcess {
        HotspotProcess {
            code_start: self.bounds.0,
            code_end: self.bounds.1,
            method_at: layout.method_at,
            sender_sp_at: layout.sender_sp_at,
        }
    }

    /// The unwind rows of the code cache, pcs from its start: a compiled frame's CFA is rsp
    /// plus its frame size once its frame is set up (rsp + 8 before: the return address
    /// only), its caller's rbp saved just below the return address; the interpreter's frames
    /// are walked by rbp ([`CfaRule::HotspotInterpreter`]); other stubs get no rule (the walk's
    /// frame pointer and stack scan fallbacks).
    pub fn rows(&self) -> Vec<UnwindRow> {
        let start = self.bounds.0;
        let mut rows = Vec::with_capacity(self.blobs.len() * 3);
        let mut push = |pc: u64, rule: CfaRule, offset: u64, rbp: Option<i16>| {
            let Ok(pc) = u32::try_from(pc.wrapping_sub(start)) else {
                return;
            };
            let offset = u16::try_from(offset).unwrap_or(0);
            let rule = if offset == 0 && rule == CfaRule::Rsp {
                CfaRule::NoInfo
            } else {
                rule
            };
            if let Some(row) = UnwindRow::new(pc, rule, offset, rbp, 0) {
                rows.push(row);
            }
        };
        for blob in &self.blobs {
            match blob.kind {
                BlobKind::Interpreter => {
                    push(blob.code_begin, CfaRule::HotspotInterpreter, 16, None)
                }
                _ if blob.frame_bytes >= 16 && blob.frame_complete >= 0 => {
                    let complete = blob.code_begin + blob.frame_complete as u64;
                    push(blob.code_begin, CfaRule::Rsp, 8, None);
                    if complete < blob.code_end {
                        push(complete, CfaRule::Rsp, blob.frame_bytes, Some(-16));
                    }
                }
                _ => push(blob.code_begin, CfaRule::NoInfo, 0, None),
            }
            push(blob.code_end, CfaRule::NoInfo, 0, None);
        }
        // Blobs are sorted and disjoint; a blob ending where the next begins leaves two rows
        // at one pc, of which the later (the next blob's) holds.
        rows.dedup_by(|later, earlier| {
            if later.pc == earlier.pc {
                *earlier = *later;
                true
            } else {
                false
            }
        });
        rows
    }
}

/// Reads the code cache of the JVM `layout` describes.
pub fn scan(
    memory: &ProcessMemory,
    layout: &Layout,
    names: &mut NameCache,
) -> anyhow::Result<Scan> {
    let low = memory.read_u64(layout.low_bound)?;
    let high = memory.read_u64(layout.high_bound)?;
    if low >= high || high - low > u32::MAX as u64 {
        return Err(anyhow!("implausible code cache bounds {low:#x}-{high:#x}"));
    }
    let heaps = memory.read_u64(layout.heaps)?;
    let count = memory.read_i32(heaps + layout.array_len)?;
    let data = memory.read_u64(heaps + layout.array_data)?;
    if !(1..=MAX_HEAPS as i32).contains(&count) {
        return Err(anyhow!("implausible number of code heaps: {count}"));
    }
    let mut scan = Scan {
        bounds: (low, high),
        ..Scan::default()
    };
    let mut budget = MAX_SCAN_BYTES;
    for i in 0..count as u64 {
        let heap = memory.read_u64(data + 8 * i)?;
        let space = heap + layout.heap_memory;
        let heap_low = memory.read_u64(space + layout.space_low)?;
        let heap_high = memory.read_u64(space + layout.space_high)?;
        let log2 = memory.read_i32(heap + layout.heap_log2_segment)?;
        if !(4..=16).contains(&log2) || heap_low < low || heap_high > high || heap_low > heap_high {
            return Err(anyhow!(
                "implausible code heap {heap_low:#x}-{heap_high:#x}"
            ));
        }
        walk_heap(
            memory,
            layout,
            (heap_low, heap_high),
            log2 as u32,
            &mut budget,
            names,
            &mut scan,
        )
        .with_context(|| format!("code heap {heap_low:#x}-{heap_high:#x}"))?;
    }
    scan.blobs.sort_by_key(|b| b.code_begin);
    // Overlapping blobs are a torn read or a lie: the later one goes.
    let mut end = 0;
    scan.blobs.retain(|b| {
        let keep = b.code_begin >= end;
        if keep {
            end = b.code_end;
        }
        keep
    });
    Ok(scan)
}

/// Blob names by the address of their string in libjvm (a few dozen distinct ones).
#[derive(Default)]
pub struct NameCache(std::collections::HashMap<u64, String>);

impl NameCache {
    fn get(&mut self, memory: &ProcessMemory, at: u64) -> String {
        if let Some(name) = self.0.get(&at) {
            return name.clone();
        }
        let name = memory.read_c_string(at, 128).unwrap_or_default();
        if self.0.len() < 4096 {
            self.0.insert(at, name.clone());
        }
        name
    }
}

fn walk_heap(
    memory: &ProcessMemory,
    layout: &Layout,
    (low, high): (u64, u64),
    log2: u32,
    budget: &mut u64,
    names: &mut NameCache,
    scan: &mut Scan,
) -> anyhow::Result<()> {
    let header_bytes = layout.block_size as usize;
    // The blob fields read, past the block header.
    let blob_bytes = [
        layout.blob_name + 8,
        layout.blob_frame_size + 4,
        layout.blob_frame_complete + 4,
        match layout.blob_code {
            CodeBounds::Pointers { begin, end } | CodeBounds::Offsets { begin, end } => {
                begin.max(end) + 8
            }
        },
        layout.nmethod_method + 8,
        layout.nmethod_compile_id + 4,
        layout.nmethod_comp_level + 4,
        layout.nmethod_entry_bci + 4,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as usize;
    let mut at = low;
    let mut chunk: Vec<u8> = Vec::new();
    let mut chunk_at = 0u64;
    while at < high {
        let need = (header_bytes + blob_bytes) as u64;
        if at < chunk_at || at + need > chunk_at + chunk.len() as u64 {
            let len = CHUNK.max(need).min(high - at);
            if len < need.min(high - at) || *budget < len {
                scan.cut = *budget < len;
                return Ok(());
            }
            *budget -= len;
            chunk = memory.read_vec(at, len as usize)?;
            chunk_at = at;
        }
        let block = &chunk[(at - chunk_at) as usize..];
        let word = |off: u64| -> u64 {
            block
                .get(off as usize..off as usize + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
                .unwrap_or(0)
        };
        let int = |off: u64| -> i32 {
            block
                .get(off as usize..off as usize + 4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4")))
                .unwrap_or(0)
        };
        // A field narrower than 8 bytes is read at its width (little-endian, sign-extended
        // where signed: only the frame-complete offset is).
        let sized = |off: u64, width: usize| -> u64 {
            let mut bytes = [0u8; 8];
            if let Some(b) = block.get(off as usize..off as usize + width) {
                bytes[..width].copy_from_slice(b);
            }
            u64::from_le_bytes(bytes)
        };
        let segments = sized(layout.block_length, layout.block_length_width.min(8));
        if segments == 0 || segments > (high - at) >> log2 {
            // The end of the used part (free space past the last block), or a lie.
            return Ok(());
        }
        let used = block.get(layout.block_used as usize).copied().unwrap_or(0) != 0;
        if used && scan.blobs.len() < MAX_BLOBS {
            let blob_at = at + layout.block_size;
            let b = layout.block_size;
            let (code_begin, code_end) = match layout.blob_code {
                CodeBounds::Pointers { begin, end } => (word(b + begin), word(b + end)),
                CodeBounds::Offsets { begin, end } => (
                    blob_at.wrapping_add(int(b + begin) as i64 as u64),
                    blob_at.wrapping_add(int(b + end) as i64 as u64),
                ),
            };
            let block_end = at + (segments << log2);
            if blob_at <= code_begin && code_begin < code_end && code_end <= block_end {
                let name = names.get(memory, word(b + layout.blob_name));
                let frame_size = int(b + layout.blob_frame_size);
                let kind = if name == "Interpreter" {
                    BlobKind::Interpreter
                } else if name.ends_with("nmethod") {
                    BlobKind::Compiled {
                        method: word(b + layout.nmethod_method),
                        compile_id: int(b + layout.nmethod_compile_id),
                        level: int(b + layout.nmethod_comp_level),
                        entry_bci: int(b + layout.nmethod_entry_bci),
                    }
                } else {
                    BlobKind::Stub(name)
                };
                scan.blobs.push(Blob {
                    header: blob_at,
                    code_begin,
                    code_end,
                    frame_bytes: if (0..1 << 13).contains(&frame_size) {
                        frame_size as u64 * 8
                    } else {
                        0
                    },
                    frame_complete: match layout.blob_frame_complete_width {
                        2 => sized(b + layout.blob_frame_complete, 2) as u16 as i16 as i32,
                        _ => int(b + layout.blob_frame_complete),
                    }
                    .min((code_end - code_begin) as i32),
                    kind,
                });
            }
        }
        at += segments << log2;
    }
    Ok(())
}

/// Deepest inlining read: C2 inlines at most `MaxInlineLevel` (15) deep.
const MAX_INLINE_DEPTH: usize = 64;
/// `PcDesc`s of one compiled method read at most.
const MAX_PC_DESCS: u64 = 1 << 16;

/// The methods running at `pc` of compiled method `blob` (its `Method*`s, the innermost
/// first), from its debug information: the scope of the first `PcDesc` at or after `pc` (a
/// return address has its own; another pc takes the next safepoint's, as HotSpot's
/// approximate lookup does), then each scope's caller. `None` when it has none to read.
pub fn inlined_methods(
    memory: &ProcessMemory,
    inline: &InlineLayout,
    blob: &Blob,
    pc: u64,
) -> anyhow::Result<Option<Vec<u64>>> {
    let [descs_begin, descs_end, scopes, metadata] = inline.tables(memory, blob.header)?;
    let size = inline.pc_desc_size;
    if descs_end < descs_begin || size == 0 || (descs_end - descs_begin) / size > MAX_PC_DESCS {
        return Err(anyhow!("implausible PcDesc table"));
    }
    let descs = memory.read_vec(descs_begin, (descs_end - descs_begin) as usize)?;
    let relative = pc.wrapping_sub(blob.code_begin);
    let field = |d: &[u8], at: u64| {
        d.get(at as usize..at as usize + 4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4")))
    };
    let scope = descs
        .chunks_exact(size as usize)
        .filter_map(|d| {
            Some((
                field(d, inline.pc_desc_pc)?,
                field(d, inline.pc_desc_scope)?,
            ))
        })
        .filter(|&(pc_offset, _)| pc_offset >= 0 && pc_offset as u64 >= relative)
        .min_by_key(|&(pc_offset, _)| pc_offset)
        .map(|(_, scope)| scope);
    let Some(mut scope) = scope.filter(|s| *s > 0) else {
        return Ok(None);
    };
    let mut methods = Vec::new();
    while scope > 0 && methods.len() < MAX_INLINE_DEPTH {
        // Three compressed ints (at most 5 bytes each): the caller's scope, the method's
        // index in the metadata table, the bci.
        let bytes = memory.read_vec(scopes + scope as u64, 15)?;
        let mut at = 0;
        let base = inline.unsigned5_base;
        let sender = read_compressed_int(&bytes, &mut at, base).ok_or_else(|| anyhow!("scope"))?;
        let index = read_compressed_int(&bytes, &mut at, base).ok_or_else(|| anyhow!("scope"))?;
        if index == 0 || index > 1 << 20 {
            return Err(anyhow!("metadata index {index}"));
        }
        methods.push(memory.read_u64(metadata + 8 * (index as u64 - 1))?);
        if sender as i64 >= scope as i64 {
            // Callers' scopes are written before their callees'.
            break;
        }
        scope = sender as i32;
    }
    Ok(Some(methods))
}

/// One int of HotSpot's `CompressedReadStream` (bytes below 192 end a number; up to five
/// bytes, each after the first worth 64 times the one before; each byte counted from `base`:
/// 0 to JDK 19, 1 since).
fn read_compressed_int(bytes: &[u8], at: &mut usize, base: u32) -> Option<u32> {
    const L: u32 = 192;
    let first = *bytes.get(*at)? as u32;
    *at += 1;
    if first < L {
        return Some(first.wrapping_sub(base));
    }
    let mut sum = first.wrapping_sub(base);
    let mut shift = 6;
    for i in 1..5 {
        let b = *bytes.get(*at)? as u32;
        *at += 1;
        sum = sum.wrapping_add(b.wrapping_sub(base) << shift);
        if b < L || i == 4 {
            return Some(sum);
        }
        shift += 6;
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::read_compressed_int;

    /// HotSpot's compressed ints as each encoding writes them: one byte below 192, else a
    /// first byte of 192 or more and then 64 times each following byte's worth; since JDK 20
    /// every byte is one more than its worth (no zero byte is ever written).
    #[test]
    fn compressed_ints_of_both_encodings() {
        let mut at = 0;
        assert_eq!(read_compressed_int(&[5, 191], &mut at, 0), Some(5));
        assert_eq!(read_compressed_int(&[5, 191], &mut at, 0), Some(191));
        // 200 + 64 * 3.
        let mut at = 0;
        assert_eq!(read_compressed_int(&[200, 3], &mut at, 0), Some(392));
        assert_eq!(at, 2);
        // The same numbers from JDK 20 on.
        let mut at = 0;
        assert_eq!(read_compressed_int(&[6, 192], &mut at, 1), Some(5));
        let mut at = 0;
        assert_eq!(read_compressed_int(&[201, 4], &mut at, 1), Some(392));
        // A stream cut short is no number.
        let mut at = 0;
        assert_eq!(read_compressed_int(&[201], &mut at, 1), None);
    }
}
