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

/// Size of 3.13's `_Py_DebugOffsets` (its layout is fixed for all 3.13.x).
pub const DEBUG_OFFSETS_SIZE: usize = 584;
/// The first 8 bytes of `_Py_DebugOffsets`.
pub const DEBUG_OFFSETS_COOKIE: &[u8; 8] = b"xdebugpy";

/// Byte positions of the fields bpfprof uses within 3.13's `_Py_DebugOffsets` (each a `u64`).
mod debug_offsets {
    pub const VERSION: usize = 8;
    pub const FREE_THREADED: usize = 16;
    pub const RUNTIME_INTERPRETERS_HEAD: usize = 40;
    pub const INTERP_NEXT: usize = 64;
    pub const INTERP_THREADS_HEAD: usize = 72;
    pub const TSTATE_NEXT: usize = 168;
    pub const TSTATE_CURRENT_FRAME: usize = 184;
    pub const TSTATE_THREAD_ID: usize = 192;
    pub const TSTATE_NATIVE_THREAD_ID: usize = 200;
    pub const FRAME_PREVIOUS: usize = 232;
    pub const FRAME_EXECUTABLE: usize = 240;
    pub const FRAME_INSTR_PTR: usize = 248;
    pub const FRAME_OWNER: usize = 264;
    pub const CODE_FILENAME: usize = 280;
    pub const CODE_NAME: usize = 288;
    pub const CODE_QUALNAME: usize = 296;
    pub const CODE_LINETABLE: usize = 304;
    pub const CODE_FIRSTLINENO: usize = 312;
    pub const CODE_ADAPTIVE: usize = 344;
    pub const OBJECT_TYPE: usize = 360;
    pub const TYPE_NAME: usize = 376;
    pub const BYTES_SIZE: usize = 520;
    pub const BYTES_DATA: usize = 528;
    pub const UNICODE_STATE: usize = 544;
    pub const UNICODE_LENGTH: usize = 552;
    pub const UNICODE_ASCII_SIZE: usize = 560;
    pub const INTERP_CEVAL_GIL: usize = 112;
    pub const INTERP_GIL_STATE: usize = 120;
    pub const INTERP_GIL_LOCKED: usize = 136;
    pub const INTERP_GIL_HOLDER: usize = 144;
}

/// Bytes a `PyCompactUnicodeObject` adds to a `PyASCIIObject` in 3.12 and later: `utf8_length`
/// and the `utf8` pointer (`_Py_DebugOffsets` gives only the ASCII header's size).
const COMPACT_EXTRA: u32 = 16;

impl Layout {
    /// The layout of CPython 3.13 from its `_Py_DebugOffsets` (`raw`: the first
    /// [`DEBUG_OFFSETS_SIZE`] bytes of `_PyRuntime`).
    pub fn from_debug_offsets(raw: &[u8]) -> Result<Layout> {
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
        let small = |at: usize| -> Result<u32> {
            let v = field(at);
            // Every offset bpfprof uses lies within a few hundred KiB of its struct's start.
            u32::try_from(v)
                .ok()
                .filter(|&v| v < (1 << 24))
                .ok_or_else(|| anyhow!("_Py_DebugOffsets: implausible offset {v:#x} at byte {at}"))
        };
        use debug_offsets as d;
        let hex = field(d::VERSION);
        let (major, minor) = ((hex >> 24) & 0xff, (hex >> 16) & 0xff);
        ensure!(
            (major, minor) == (3, 13),
            "_Py_DebugOffsets of version {major}.{minor} ({hex:#x}): only 3.13's layout is known"
        );
        ensure!(
            field(d::FREE_THREADED) == 0,
            "a free-threaded (no-GIL) CPython 3.13: its object headers are not supported"
        );
        Ok(Layout {
            kernel: PythonProcess {
                tstate_frame: small(d::TSTATE_CURRENT_FRAME)?,
                cframe_current_frame: NO_CFRAME,
                frame_previous: small(d::FRAME_PREVIOUS)?,
                frame_code: small(d::FRAME_EXECUTABLE)?,
                frame_instr: small(d::FRAME_INSTR_PTR)?,
                instr_rule: PythonInstrRule::Pointer as u32,
                frame_entry: small(d::FRAME_OWNER)?,
                entry_rule: PythonEntryRule::ShimFrame as u32,
                code_instructions: small(d::CODE_ADAPTIVE)?,
                version: 0x030d,
                gil_holder: 0,
                gil_locked: 0,
                frame_window: DATA_STACK_WINDOW,
                // co_nfreevars and co_version, as for 3.12: 20 and 24 bytes past co_firstlineno
                // (the debug offsets do not list them; `code.h` has five ints between them).
                code_identity: small(d::CODE_FIRSTLINENO)? + 20,
                code_identity_deref: 0,
                reserved: 0,
            },
            runtime_interpreters_head: small(d::RUNTIME_INTERPRETERS_HEAD)?,
            interp_next: small(d::INTERP_NEXT)?,
            interp_threads_head: small(d::INTERP_THREADS_HEAD)?,
            tstate_next: small(d::TSTATE_NEXT)?,
            tstate_thread_id: small(d::TSTATE_THREAD_ID)?,
            tstate_native_thread_id: Some(small(d::TSTATE_NATIVE_THREAD_ID)?),
            code_filename: small(d::CODE_FILENAME)?,
            code_name: small(d::CODE_NAME)?,
            code_qualname: Some(small(d::CODE_QUALNAME)?),
            code_firstlineno: small(d::CODE_FIRSTLINENO)?,
            code_linetable: small(d::CODE_LINETABLE)?,
            object_type: small(d::OBJECT_TYPE)?,
            type_name: small(d::TYPE_NAME)?,
            unicode_length: small(d::UNICODE_LENGTH)?,
            unicode_state: small(d::UNICODE_STATE)?,
            unicode_ascii_size: small(d::UNICODE_ASCII_SIZE)?,
            unicode_compact_size: small(d::UNICODE_ASCII_SIZE)? + COMPACT_EXTRA,
            bytes_size: small(d::BYTES_SIZE)?,
            bytes_data: small(d::BYTES_DATA)?,
            line_format: LineTableFormat::Locations,
            // 3.13 gives the offsets of the fields of the interpreter's own `_gil` in
            // `PyInterpreterState`; `ceval.gil` points to that struct (to the main
            // interpreter's for interpreters that share its GIL).
            gil: GilLayout::PerInterpreter {
                interp_gil: small(d::INTERP_CEVAL_GIL)?,
                locked: small(d::INTERP_GIL_LOCKED)?
                    .checked_sub(small(d::INTERP_GIL_STATE)?)
                    .ok_or_else(|| anyhow!("_Py_DebugOffsets: GIL's locked before the GIL"))?,
                last_holder: small(d::INTERP_GIL_HOLDER)?
                    .checked_sub(small(d::INTERP_GIL_STATE)?)
                    .ok_or_else(|| anyhow!("_Py_DebugOffsets: GIL's holder before the GIL"))?,
            },
        })
    }

    /// The kernel's frame chain starts at a `_PyCFrame` (3.11, 3.12) rather than at the frame.
    pub fn has_cframe(&self) -> bool {
        self.kernel.cframe_current_frame != NO_CFRAME
    }
}
