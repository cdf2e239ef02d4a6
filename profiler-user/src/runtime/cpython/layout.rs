//! Where CPython keeps what a profiler reads, per minor version: the byte offsets of the fields
//! of its runtime, interpreter, thread, frame, code, string and bytes objects (x86-64, default
//! non-debug, GIL builds).
//!
//! 3.10, 3.11 and 3.12 have no self-description: their numbers below were read from the DWARF of
//! pyenv's `-g` builds (`gdb -batch -ex 'print/d (long)&((PyThreadState*)0)->next' libpython…`),
//! and the `python_layout` end-to-end test re-derives them from that DWARF. The layout of a
//! public struct does not change within a minor version (CPython's ABI rule for 3.x.y), so one
//! table serves every 3.x.y. 3.13 publishes its offsets in `_Py_DebugOffsets` at the start of
//! `_PyRuntime`; [`Layout::from_debug_offsets`] builds the layout from those.

use anyhow::{anyhow, ensure};
use profiler_common::{
    PythonEntryRule, PythonInstrRule, PythonProcess, PYTHON_FRAME_BYTES, PYTHON_FRAME_WINDOW_BYTES,
};

use super::linetable::LineTableFormat;
use anyhow::Result;

/// Everything bpfprof reads in one CPython version's memory: the kernel program's part
/// ([`PythonProcess`]) and the offsets only userspace needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The offsets the kernel program walks frames with.
    pub kernel: PythonProcess,
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters_head: u32,
    /// `PyInterpreterState.next`.
    pub interp_next: u32,
    /// `PyInterpreterState.threads.head` (3.10 `tstate_head`).
    pub interp_threads_head: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.thread_id` (the thread's `pthread_t`).
    pub tstate_thread_id: u32,
    /// `PyThreadState.native_thread_id` (3.11 and later).
    pub tstate_native_thread_id: Option<u32>,
    /// `PyCodeObject.co_filename`.
    pub code_filename: u32,
    /// `PyCodeObject.co_name`.
    pub code_name: u32,
    /// `PyCodeObject.co_qualname` (3.11 and later).
    pub code_qualname: Option<u32>,
    /// `PyCodeObject.co_firstlineno` (a C `int`).
    pub code_firstlineno: u32,
    /// `PyCodeObject.co_linetable` (a bytes object).
    pub code_linetable: u32,
    /// `PyObject.ob_type`.
    pub object_type: u32,
    /// `PyTypeObject.tp_name`.
    pub type_name: u32,
    /// `PyASCIIObject.length` (in characters).
    pub unicode_length: u32,
    /// `PyASCIIObject.state` (the bit field word).
    pub unicode_state: u32,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    pub unicode_ascii_size: u32,
    /// `sizeof(PyCompactUnicodeObject)`: where a compact non-ASCII string's characters start.
    pub unicode_compact_size: u32,
    /// `PyVarObject.ob_size` of a bytes object.
    pub bytes_size: u32,
    /// `PyBytesObject.ob_sval`.
    pub bytes_data: u32,
    /// The format of `co_linetable`.
    pub line_format: LineTableFormat,
    /// Where the main interpreter's GIL is.
    pub gil: GilLayout,
}

/// Where the main interpreter's GIL (`struct _gil_runtime_state`) is, and its `locked` (a C
/// `int`) and `last_holder` (a `PyThreadState *`) fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GilLayout {
    /// Inside `_PyRuntime` (3.10, 3.11: `_PyRuntime.ceval.gil`); offsets from `_PyRuntime`.
    InRuntime {
        /// Offset of `ceval.gil.locked` in `_PyRuntime`.
        locked: u32,
        /// Offset of `ceval.gil.last_holder` in `_PyRuntime`.
        last_holder: u32,
    },
    /// Per interpreter (3.12 and later): `PyInterpreterState.ceval.gil` points to it.
    PerInterpreter {
        /// Offset of the `ceval.gil` pointer in `PyInterpreterState`.
        interp_gil: u32,
        /// Offset of `locked` in the GIL's struct.
        locked: u32,
        /// Offset of `last_holder` in the GIL's struct.
        last_holder: u32,
    },
}

/// Bits of `PyASCIIObject.state` (the same in 3.10-3.13): `interned:2, kind:3, compact:1,
/// ascii:1, ...`, allocated from bit 0 on x86-64.
pub mod unicode_state {
    /// Shift of the `kind` field (1, 2 or 4 bytes per character).
    pub const KIND_SHIFT: u32 = 2;
    /// Mask of the `kind` field after shifting.
    pub const KIND_MASK: u32 = 0b111;
    /// The `compact` bit: the characters follow the object header.
    pub const COMPACT: u32 = 1 << 5;
    /// The `ascii` bit: the characters are ASCII, right after a `PyASCIIObject`.
    pub const ASCII: u32 = 1 << 6;
}

/// `offsetof(PyObject, ob_type)` and `offsetof(PyTypeObject, tp_name)` in every GIL build.
const OB_TYPE: u32 = 8;
const TP_NAME: u32 = 24;
/// `PyVarObject.ob_size` and `PyBytesObject.ob_sval` in every GIL build up to 3.13.
const BYTES_SIZE: u32 = 16;
const BYTES_DATA: u32 = 32;
/// `PyASCIIObject.hash` in 3.10 and 3.11: a string's cached hash, computed when it was
/// interned, as every code object's `co_name` is.
const STR_HASH: u32 = 24;

/// `Layout::kernel.cframe_current_frame` where the thread state points to the frame directly.
const NO_CFRAME: u32 = u32::MAX;

/// `Layout::kernel.frame_window` of 3.11 and later, whose frames lie one after another on each
/// thread's data stack: the kernel reads a frame's next callers with it.
const DATA_STACK_WINDOW: u32 = PYTHON_FRAME_WINDOW_BYTES as u32;

/// The layout of CPython 3.`minor` for `minor` in 10..=12; 3.13 and later describe themselves.
pub fn table(minor: u8) -> Option<Layout> {
    let version = 0x0300 | minor as u32;
    match minor {
        10 => Some(Layout {
            kernel: PythonProcess {
                tstate_frame: 24,
                cframe_current_frame: NO_CFRAME,
                frame_previous: 24,
                frame_code: 32,
                frame_instr: 96,
                instr_rule: PythonInstrRule::LastiIndex as u32,
                frame_entry: 0,
                entry_rule: PythonEntryRule::EveryFrame as u32,
                code_instructions: 0,
                version,
                gil_holder: 0,
                gil_locked: 0,
                // Frame objects are allocated one by one: their callers are elsewhere.
                frame_window: PYTHON_FRAME_BYTES as u32,
                // co_name's hash (see `PythonProcess::code_identity_deref`).
                code_identity: 112,
                code_identity_deref: STR_HASH,
                reserved: 0,
            },
            runtime_interpreters_head: 32,
            interp_next: 0,
            interp_threads_head: 8,
            tstate_next: 8,
            tstate_thread_id: 176,
            tstate_native_thread_id: None,
            code_filename: 104,
            code_name: 112,
            code_qualname: None,
            code_firstlineno: 40,
            code_linetable: 120,
            object_type: OB_TYPE,
            type_name: TP_NAME,
            unicode_length: 16,
            unicode_state: 32,
            unicode_ascii_size: 48,
            unicode_compact_size: 72,
            bytes_size: BYTES_SIZE,
            bytes_data: BYTES_DATA,
            line_format: LineTableFormat::Pep626,
            gil: GilLayout::InRuntime {
                locked: 368,
                last_holder: 360,
            },
        }),
        11 => Some(Layout {
            kernel: PythonProcess {
                tstate_frame: 56,
                cframe_current_frame: 8,
                frame_previous: 48,
                frame_code: 32,
                frame_instr: 56,
                instr_rule: PythonInstrRule::Pointer as u32,
                frame_entry: 68,
                entry_rule: PythonEntryRule::EntryFlag as u32,
                code_instructions: 184,
                version,
                gil_holder: 0,
                gil_locked: 0,
                frame_window: DATA_STACK_WINDOW,
                // co_name's hash (see `PythonProcess::code_identity_deref`).
                code_identity: 120,
                code_identity_deref: STR_HASH,
                reserved: 0,
            },
            runtime_interpreters_head: 40,
            interp_next: 0,
            interp_threads_head: 16,
            tstate_next: 8,
            tstate_thread_id: 152,
            tstate_native_thread_id: Some(160),
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_firstlineno: 72,
            code_linetable: 136,
            object_type: OB_TYPE,
            type_name: TP_NAME,
            unicode_length: 16,
            unicode_state: 32,
            unicode_ascii_size: 48,
            unicode_compact_size: 72,
            bytes_size: BYTES_SIZE,
            bytes_data: BYTES_DATA,
            line_format: LineTableFormat::Locations,
            gil: GilLayout::InRuntime {
                locked: 376,
                last_holder: 368,
            },
        }),
        12 => Some(Layout {
            kernel: PythonProcess {
                tstate_frame: 56,
                cframe_current_frame: 0,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                instr_rule: PythonInstrRule::Pointer as u32,
                frame_entry: 70,
                entry_rule: PythonEntryRule::ShimFrame as u32,
                code_instructions: 192,
                version,
                gil_holder: 0,
                gil_locked: 0,
                frame_window: DATA_STACK_WINDOW,
                // co_nfreevars and co_version: CPython numbers each code object it makes, so a
                // new one at a freed one's address differs here even where its name is at the
                // old name's address (code made again from one template).
                code_identity: 88,
                code_identity_deref: 0,
                reserved: 0,
            },
            runtime_interpreters_head: 40,
            interp_next: 0,
            interp_threads_head: 72,
            tstate_next: 8,
            tstate_thread_id: 136,
            tstate_native_thread_id: Some(144),
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_firstlineno: 68,
            code_linetable: 136,
            object_type: OB_TYPE,
            type_name: TP_NAME,
            unicode_length: 16,
            unicode_state: 32,
            // 3.12 removed `wstr` and `wstr_length`: both headers shrank.
            unicode_ascii_size: 40,
            unicode_compact_size: 56,
            bytes_size: BYTES_SIZE,
            bytes_data: BYTES_DATA,
            line_format: LineTableFormat::Locations,
            gil: GilLayout::PerInterpreter {
                interp_gil: 384,
                locked: 16,
                last_holder: 8,
            },
        }),
        _ => None,
    }
}

/// Bytes of `_PyRuntime` read for its `_Py_DebugOffsets`: more than any known version's struct
/// (3.13: 584, 3.14: 760, 3.15: 888 bytes); `_PyRuntime` itself is hundreds of KiB.
pub const DEBUG_OFFSETS_SIZE: usize = 1024;
/// The first 8 bytes of `_Py_DebugOffsets`.
pub const DEBUG_OFFSETS_COOKIE: &[u8; 8] = b"xdebugpy";
/// The CPython versions whose `_Py_DebugOffsets` bpfprof knows the fields of.
pub const DEBUG_OFFSETS_VERSIONS: &[u8] = &[13, 14, 15];

/// Where, in one version's `_Py_DebugOffsets` (all `u64`s), the fields bpfprof uses are, each
/// with the position of the size of the struct it is an offset into: that struct's
/// `sizeof`, which each section of `_Py_DebugOffsets` states first. The struct gains fields
/// and sections from version to version (3.14 added `threads_main`, `stackpointer`,
/// `tlbc_index`, `co_tlbc` and sections; 3.15 added thread fields and a section after the
/// type object's), so positions are per version; the values themselves are the target's.
#[derive(Clone, Copy, Debug)]
struct DebugPositions {
    runtime: (usize, usize),
    interp_next: (usize, usize),
    interp_threads_head: (usize, usize),
    interp_ceval_gil: (usize, usize),
    interp_gil_state: (usize, usize),
    interp_gil_locked: (usize, usize),
    interp_gil_holder: (usize, usize),
    tstate_next: (usize, usize),
    tstate_current_frame: (usize, usize),
    tstate_thread_id: (usize, usize),
    tstate_native_thread_id: (usize, usize),
    frame_previous: (usize, usize),
    frame_executable: (usize, usize),
    frame_instr_ptr: (usize, usize),
    frame_owner: (usize, usize),
    code_filename: (usize, usize),
    code_name: (usize, usize),
    code_qualname: (usize, usize),
    code_linetable: (usize, usize),
    code_firstlineno: (usize, usize),
    code_localsplusnames: (usize, usize),
    code_adaptive: (usize, usize),
    object_type: (usize, usize),
    type_name: (usize, usize),
    bytes_size: (usize, usize),
    bytes_data: (usize, usize),
    unicode_state: (usize, usize),
    unicode_length: (usize, usize),
    unicode_ascii_size: (usize, usize),
}

/// Byte positions in `_Py_DebugOffsets` of its version and free-threading fields (all
/// versions).
const DEBUG_VERSION: usize = 8;
const DEBUG_FREE_THREADED: usize = 16;

/// The positions of 3.`minor`'s `_Py_DebugOffsets` fields: from `pycore_debug_offsets.h` of
/// each release, checked against Debian's and pyenv's interpreters (the values each holds are
/// what `python_layout` compares with the interpreter's own report).
fn debug_positions(minor: u8) -> Option<DebugPositions> {
    // Each section's first field is the size of its struct: (section start + 8 * index,
    // section start).
    let f = |section: usize, index: usize| (section + 8 * index, section);
    // Sections common to the versions that differ only in their starts.
    let (runtime, interp, tstate, frame, code, object, type_, bytes, unicode) = match minor {
        13 => (24, 48, 152, 224, 272, 352, 368, 512, 536),
        14 => (24, 48, 176, 248, 312, 400, 416, 592, 616),
        15 => (24, 48, 176, 312, 376, 464, 480, 688, 712),
        _ => return None,
    };
    // 3.14 put `threads_main` after `threads_head`: the GIL fields moved one down.
    let gil = if minor == 13 { 8 } else { 9 };
    // 3.15 put `base_frame`, `last_profiled_frame` and another pointer between
    // `current_frame` and `thread_id`.
    let thread_id = if minor == 15 { 8 } else { 5 };
    Some(DebugPositions {
        runtime: f(runtime, 2),
        interp_next: f(interp, 2),
        interp_threads_head: f(interp, 3),
        interp_ceval_gil: f(interp, gil),
        interp_gil_state: f(interp, gil + 1),
        interp_gil_locked: f(interp, gil + 3),
        interp_gil_holder: f(interp, gil + 4),
        tstate_next: f(tstate, 2),
        tstate_current_frame: f(tstate, 4),
        tstate_thread_id: f(tstate, thread_id),
        tstate_native_thread_id: f(tstate, thread_id + 1),
        frame_previous: f(frame, 1),
        frame_executable: f(frame, 2),
        frame_instr_ptr: f(frame, 3),
        frame_owner: f(frame, 5),
        code_filename: f(code, 1),
        code_name: f(code, 2),
        code_qualname: f(code, 3),
        code_linetable: f(code, 4),
        code_firstlineno: f(code, 5),
        code_localsplusnames: f(code, 7),
        code_adaptive: f(code, 9),
        object_type: f(object, 1),
        type_name: f(type_, 1),
        bytes_size: f(bytes, 1),
        bytes_data: f(bytes, 2),
        unicode_state: f(unicode, 1),
        unicode_length: f(unicode, 2),
        unicode_ascii_size: f(unicode, 3),
    })
}

/// Bytes a `PyCompactUnicodeObject` adds to a `PyASCIIObject` in 3.12 and later: `utf8_length`
/// and the `utf8` pointer (`_Py_DebugOffsets` gives only the ASCII header's size).
const COMPACT_EXTRA: u32 = 16;

/// Largest struct size `_Py_DebugOffsets` may state: `_PyRuntimeState` is about 300 KiB and
/// `PyInterpreterState` 220 KiB in 3.14; 16 MiB is no real interpreter's.
const MAX_STATED_SIZE: u64 = 1 << 24;

/// `co_nfreevars` and `co_version` (the identity word, see
/// [`PythonProcess::code_identity`]) follow `co_firstlineno` after `co_nlocalsplus`,
/// `co_framesize`, `co_nlocals` and `co_ncellvars` (`code.h` of 3.12 to 3.15), and
/// `co_localsplusnames` follows them: 7 `int`s from `co_firstlineno` on.
const FIRSTLINENO_TO_IDENTITY: u32 = 20;
const FIRSTLINENO_TO_LOCALSPLUSNAMES: u32 = 28;

impl Layout {
    /// The layout of CPython 3.13 and later from its `_Py_DebugOffsets` (`raw`: the first
    /// [`DEBUG_OFFSETS_SIZE`] bytes of `_PyRuntime`), whose interpreter says it is version
    /// `expected` (`Py_Version` or its name). Checked: the cookie, the version (the
    /// interpreter's, and one whose positions are known), a GIL build, and each offset within
    /// the size its struct has by the same `_Py_DebugOffsets`, aligned to its field's size.
    pub fn from_debug_offsets(raw: &[u8], expected: (u8, u8)) -> Result<Layout> {
        ensure!(
            raw.len() >= DEBUG_OFFSETS_SIZE,
            "_Py_DebugOffsets: {} bytes, need {DEBUG_OFFSETS_SIZE}",
            raw.len()
        );
        ensure!(
            &raw[..8] == DEBUG_OFFSETS_COOKIE,
            "_PyRuntime does not start with the _Py_DebugOffsets cookie \"xdebugpy\" (found {:?})",
            String::from_utf8_lossy(&raw[..8])
        );
        let field = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        let hex = field(DEBUG_VERSION);
        let (major, minor) = (((hex >> 24) & 0xff) as u8, ((hex >> 16) & 0xff) as u8);
        ensure!(
            (major, minor) == expected,
            "_Py_DebugOffsets says version {major}.{minor} ({hex:#x}), the interpreter {}.{}",
            expected.0,
            expected.1
        );
        let positions = debug_positions(minor)
            .filter(|_| major == 3)
            .ok_or_else(|| {
                anyhow!(
                    "its _Py_DebugOffsets (version {hex:#x}) is laid out as no version bpfprof \
                 knows (3.13 to 3.15)"
                )
            })?;
        ensure!(
            field(DEBUG_FREE_THREADED) == 0,
            "a free-threaded (no-GIL) build: its object headers and per-thread bytecode are \
             not supported"
        );
        // The offset at `at`, of a field `width` bytes wide, checked against its struct's
        // stated size.
        let offset = |(at, size_at): (usize, usize), width: u64| -> Result<u32> {
            let (value, size) = (field(at), field(size_at));
            ensure!(
                size > 0 && size <= MAX_STATED_SIZE,
                "_Py_DebugOffsets: implausible struct size {size:#x} at byte {size_at}"
            );
            ensure!(
                value.checked_add(width).is_some_and(|end| end <= size)
                    && value.is_multiple_of(width),
                "_Py_DebugOffsets: offset {value:#x} at byte {at} is not a {width}-byte field \
                 within its struct's {size} bytes"
            );
            Ok(value as u32)
        };
        let p = positions;
        let firstlineno = offset(p.code_firstlineno, 4)?;
        ensure!(
            offset(p.code_localsplusnames, 8)? == firstlineno + FIRSTLINENO_TO_LOCALSPLUSNAMES,
            "_Py_DebugOffsets: co_localsplusnames is not 7 ints past co_firstlineno: \
             co_version is not where bpfprof reads it"
        );
        let gil_state = offset(p.interp_gil_state, 8)?;
        let in_gil = |at, what| -> Result<u32> {
            offset(at, 8)?
                .checked_sub(gil_state)
                .ok_or_else(|| anyhow!("_Py_DebugOffsets: GIL's {what} before the GIL"))
        };
        // 3.14 made `f_executable` a `_PyStackRef` (a tagged pointer): the kernel and
        // userspace clear `PYTHON_STACKREF_TAG_BITS` before following it, as for any version.
        Ok(Layout {
            kernel: PythonProcess {
                tstate_frame: offset(p.tstate_current_frame, 8)?,
                cframe_current_frame: NO_CFRAME,
                frame_previous: offset(p.frame_previous, 8)?,
                frame_code: offset(p.frame_executable, 8)?,
                frame_instr: offset(p.frame_instr_ptr, 8)?,
                instr_rule: PythonInstrRule::Pointer as u32,
                frame_entry: offset(p.frame_owner, 1)?,
                // The eval loop's entry frame: owner 3 in 3.12 and 3.13
                // (`FRAME_OWNED_BY_CSTACK`) and in 3.14 and 3.15 (renamed
                // `FRAME_OWNED_BY_INTERPRETER`; 3.15's thread's base frame has it too).
                entry_rule: PythonEntryRule::ShimFrame as u32,
                code_instructions: offset(p.code_adaptive, 2)?,
                version: 0x0300 | minor as u32,
                gil_holder: 0,
                gil_locked: 0,
                frame_window: DATA_STACK_WINDOW,
                // co_nfreevars and co_version, as for 3.12.
                code_identity: firstlineno + FIRSTLINENO_TO_IDENTITY,
                code_identity_deref: 0,
                reserved: 0,
            },
            runtime_interpreters_head: offset(p.runtime, 8)?,
            interp_next: offset(p.interp_next, 8)?,
            interp_threads_head: offset(p.interp_threads_head, 8)?,
            tstate_next: offset(p.tstate_next, 8)?,
            tstate_thread_id: offset(p.tstate_thread_id, 8)?,
            tstate_native_thread_id: Some(offset(p.tstate_native_thread_id, 8)?),
            code_filename: offset(p.code_filename, 8)?,
            code_name: offset(p.code_name, 8)?,
            code_qualname: Some(offset(p.code_qualname, 8)?),
            code_firstlineno: firstlineno,
            code_linetable: offset(p.code_linetable, 8)?,
            object_type: offset(p.object_type, 8)?,
            type_name: offset(p.type_name, 8)?,
            unicode_length: offset(p.unicode_length, 8)?,
            unicode_state: offset(p.unicode_state, 4)?,
            // A size, not an offset: `PyUnicodeObject` (whose size its section states) is a
            // `PyCompactUnicodeObject` and a data pointer, so 8 bytes at least follow it.
            unicode_ascii_size: offset(p.unicode_ascii_size, 8)?,
            unicode_compact_size: offset(p.unicode_ascii_size, 8)? + COMPACT_EXTRA,
            bytes_size: offset(p.bytes_size, 8)?,
            bytes_data: offset(p.bytes_data, 1)?,
            line_format: LineTableFormat::Locations,
            // The offsets of the fields of the interpreter's own `_gil` in
            // `PyInterpreterState`; `ceval.gil` points to that struct (to the main
            // interpreter's for interpreters that share its GIL).
            gil: GilLayout::PerInterpreter {
                interp_gil: offset(p.interp_ceval_gil, 8)?,
                locked: in_gil(p.interp_gil_locked, "locked")?,
                last_holder: in_gil(p.interp_gil_holder, "holder")?,
            },
        })
    }

    /// The kernel's frame chain starts at a `_PyCFrame` (3.11, 3.12) rather than at the frame.
    pub fn has_cframe(&self) -> bool {
        self.kernel.cframe_current_frame != NO_CFRAME
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first [`DEBUG_OFFSETS_SIZE`] bytes of `_PyRuntime` of Debian sid's `python3.14`
    /// 3.14.10 and `python3.15` 3.15.2, read from running processes' memory.
    const SID_314: &[u8] = include_bytes!("testdata/debug_offsets_3.14.bin");
    const SID_315: &[u8] = include_bytes!("testdata/debug_offsets_3.15.bin");

    fn put(blob: &mut [u8], at: usize, value: u64) {
        blob[at..at + 8].copy_from_slice(&value.to_ne_bytes());
    }

    #[test]
    fn layouts_of_3_14_and_3_15_from_their_own_offsets() {
        let l14 = Layout::from_debug_offsets(SID_314, (3, 14)).expect("3.14's offsets pass");
        let l15 = Layout::from_debug_offsets(SID_315, (3, 15)).expect("3.15's offsets pass");
        for (l, minor) in [(&l14, 14), (&l15, 15)] {
            let k = l.kernel;
            assert_eq!(k.version, 0x0300 | minor);
            // `_PyInterpreterFrame`: f_executable, previous, instr_ptr, owner (both).
            assert_eq!(
                (k.frame_code, k.frame_previous, k.frame_instr, k.frame_entry),
                (0, 8, 56, 74)
            );
            assert_eq!((k.tstate_frame, l.tstate_next), (72, 8));
            assert_eq!((k.code_instructions, l.code_firstlineno), (208, 68));
            assert_eq!(k.code_identity, 88, "co_nfreevars, co_version");
            assert_eq!((l.code_name, l.code_qualname), (120, Some(128)));
            assert_eq!((l.unicode_ascii_size, l.unicode_compact_size), (40, 56));
            assert_eq!((l.bytes_size, l.bytes_data), (16, 32));
        }
        // What moved between them (read from running processes: `pthread_self()` and the
        // tid at these offsets of the main thread's state).
        assert_eq!(
            (l14.tstate_thread_id, l14.tstate_native_thread_id),
            (152, Some(160))
        );
        assert_eq!(
            (l15.tstate_thread_id, l15.tstate_native_thread_id),
            (176, Some(184))
        );
        assert_eq!(
            l14.gil,
            GilLayout::PerInterpreter {
                interp_gil: 16,
                locked: 16,
                last_holder: 8
            }
        );
        assert_eq!(l14.runtime_interpreters_head, 808);
        assert_eq!(l15.runtime_interpreters_head, 936);
    }

    #[test]
    fn a_bad_cookie_is_refused_with_the_reason() {
        let mut blob = SID_314.to_vec();
        blob[..8].copy_from_slice(b"xdebugpz");
        let e = Layout::from_debug_offsets(&blob, (3, 14)).unwrap_err();
        assert!(e.to_string().contains("cookie"), "{e}");
    }

    #[test]
    fn a_wild_offset_is_refused_with_the_reason() {
        // 3.14's `_PyInterpreterFrame.previous` (byte 256) past the frame's stated 88 bytes.
        let mut blob = SID_314.to_vec();
        put(&mut blob, 256, 4096);
        let e = Layout::from_debug_offsets(&blob, (3, 14)).unwrap_err();
        assert!(e.to_string().contains("offset 0x1000 at byte 256"), "{e}");
        // A struct size no interpreter has.
        let mut blob = SID_315.to_vec();
        put(&mut blob, 312, u64::MAX);
        let e = Layout::from_debug_offsets(&blob, (3, 15)).unwrap_err();
        assert!(e.to_string().contains("implausible struct size"), "{e}");
        // A misaligned pointer field.
        let mut blob = SID_315.to_vec();
        put(&mut blob, 320, 9);
        let e = Layout::from_debug_offsets(&blob, (3, 15)).unwrap_err();
        assert!(e.to_string().contains("not a 8-byte field"), "{e}");
    }

    #[test]
    fn an_unknown_or_mismatched_version_is_refused_with_the_reason() {
        // 3.16.0 final, in an interpreter that says it is 3.16: no known layout.
        let mut blob = SID_315.to_vec();
        put(&mut blob, DEBUG_VERSION, 0x031000f0);
        let e = Layout::from_debug_offsets(&blob, (3, 16)).unwrap_err();
        assert!(
            e.to_string()
                .contains("laid out as no version bpfprof knows"),
            "{e}"
        );
        // 3.14's offsets in an interpreter that says it is 3.15.
        let e = Layout::from_debug_offsets(SID_314, (3, 15)).unwrap_err();
        assert!(e.to_string().contains("says version 3.14"), "{e}");
        // A free-threaded build.
        let mut blob = SID_314.to_vec();
        put(&mut blob, DEBUG_FREE_THREADED, 1);
        let e = Layout::from_debug_offsets(&blob, (3, 14)).unwrap_err();
        assert!(e.to_string().contains("free-threaded"), "{e}");
    }
}
