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

mod shapes;
mod tables;

use anyhow::Result;
use shapes::*;
pub use tables::table;

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
    /// A free-threaded (no-GIL, `--disable-gil`) build: its objects have the longer header
    /// (`ob_tid`, the local and shared reference counts: `ob_type` at 24, not 8), and there
    /// is no GIL to hold.
    pub free_threaded: bool,
    /// Where the `kind` bits start in `PyASCIIObject.state` (see [`unicode_state`]): 2 after
    /// the `interned:2` bit field, 8 in free-threaded 3.14+, whose `interned` is a whole
    /// byte (read atomically).
    pub unicode_kind_shift: u32,
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
    /// A free-threaded build: no GIL unless it is enabled at run time (`PYTHON_GIL=1`, or an
    /// extension module that does not declare it runs without one), which its `_gil`'s
    /// `enabled` says (`_PyEval_IsGILEnabled`); while it is, it is taken and held as a GIL
    /// build's. Offsets as in [`GilLayout::PerInterpreter`].
    FreeThreaded {
        /// Offset of the `ceval.gil` pointer in `PyInterpreterState`.
        interp_gil: u32,
        /// Offset of `enabled` (a C `int`, 0 while the GIL is off) in the GIL's struct.
        enabled: u32,
        /// Offset of `locked` in the GIL's struct.
        locked: u32,
        /// Offset of `last_holder` in the GIL's struct.
        last_holder: u32,
    },
}

/// Bits of `PyASCIIObject.state`: `interned:2, kind:3, compact:1, ascii:1, ...`, allocated
/// from bit 0 on x86-64 (3.10 on); free-threaded 3.14+ make `interned` an `unsigned char`,
/// and the bit fields follow it from bit 8 ([`Layout::unicode_kind_shift`]).
pub mod unicode_state {
    /// Shift of the `kind` field (1, 2 or 4 bytes per character) after `interned:2`.
    pub const KIND_SHIFT: u32 = 2;
    /// Shift of the `kind` field after free-threaded 3.14+'s `unsigned char interned`.
    pub const FREE_THREADED_KIND_SHIFT: u32 = 8;
    /// Mask of the `kind` field after shifting.
    pub const KIND_MASK: u32 = 0b111;
    /// The `compact` bit, relative to the `kind` field: the characters follow the header.
    pub const COMPACT: u32 = 1 << 3;
    /// The `ascii` bit, relative to the `kind` field: the characters are ASCII, right after
    /// a `PyASCIIObject`.
    pub const ASCII: u32 = 1 << 4;
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

/// Bytes of `_PyRuntime` read for its `_Py_DebugOffsets`: more than any known version's struct
/// (3.13: 584, 3.14: 760, 3.15: 888 bytes); `_PyRuntime` itself is hundreds of KiB.
pub const DEBUG_OFFSETS_SIZE: usize = 1024;
/// The first 8 bytes of `_Py_DebugOffsets`.
pub const DEBUG_OFFSETS_COOKIE: &[u8; 8] = b"xdebugpy";
/// The CPython versions whose `_Py_DebugOffsets` bpfprof knows the shape of; a later version
/// whose struct has one of their shapes, and passes every check, is walked with it.
pub const DEBUG_OFFSETS_VERSIONS: &[u8] = &[13, 14, 15];

/// Whether `_Py_DebugOffsets` (`raw`, as for [`Layout::from_debug_offsets`]) says its build is
/// free-threaded: its cookie and its `free_threaded` word (0 or 1) are all that is read, so it
/// answers for a layout refused otherwise (`bpfprof doctor`); `None` when they do not hold.
pub fn stated_free_threaded(raw: &[u8]) -> Option<bool> {
    if raw.len() < DEBUG_SECTIONS || &raw[..8] != DEBUG_OFFSETS_COOKIE {
        return None;
    }
    let word = u64::from_ne_bytes(raw[DEBUG_FREE_THREADED..DEBUG_SECTIONS].try_into().ok()?);
    match word {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

impl Layout {
    /// The layout of CPython 3.13 and later from its `_Py_DebugOffsets` (`raw`: the first
    /// [`DEBUG_OFFSETS_SIZE`] bytes of `_PyRuntime`), whose interpreter says it is version
    /// `expected` (`Py_Version` or its name). Checked: the cookie, the version (the
    /// interpreter's), the struct's shape (3.13 to 3.15's for those versions; for a later
    /// one, the newest known shape its struct has, [`check_shape`]) and each offset within
    /// the size its struct has by the same `_Py_DebugOffsets`, aligned to its field's size.
    /// Free-threaded builds (3.13t, 3.14t, 3.15t) are read through the same offsets.
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
        let free_threaded = match field(DEBUG_FREE_THREADED) {
            0 => false,
            1 => true,
            other => anyhow::bail!("_Py_DebugOffsets: free_threaded is {other}, not 0 or 1"),
        };
        if let Some(shape) = SHAPES.iter().find(|s| s.minor == minor && major == 3) {
            check_shape(raw, shape, free_threaded)?;
            return Self::with_shape(raw, shape, minor, free_threaded);
        }
        ensure!(
            major == 3 && minor > 15,
            "its _Py_DebugOffsets (version {hex:#x}) is laid out as no version bpfprof knows \
             (3.13 to 3.15)"
        );
        // A later version: walked with the newest shape its struct has, if one passes every
        // check (a release that only appends sections, or changes values, keeps its shape).
        let mut refusals = Vec::new();
        for shape in SHAPES.iter().rev() {
            match check_shape(raw, shape, free_threaded)
                .and_then(|()| Self::with_shape(raw, shape, minor, free_threaded))
            {
                Ok(layout) => {
                    log::info!(
                        "CPython 3.{minor}'s _Py_DebugOffsets has 3.{}'s shape and passes every \
                         check: its frames are walked with its own offsets",
                        shape.minor
                    );
                    return Ok(layout);
                }
                Err(e) => refusals.push(format!("as 3.{}'s: {e:#}", shape.minor)),
            }
        }
        anyhow::bail!(
            "its _Py_DebugOffsets (version {hex:#x}) is laid out as no version bpfprof knows \
             (3.13 to 3.15): {}",
            refusals.join("; ")
        )
    }

    /// The layout from `raw` read as `shape`, for an interpreter of version 3.`minor`.
    fn with_shape(raw: &[u8], shape: &Shape, minor: u8, free_threaded: bool) -> Result<Layout> {
        let field = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
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
        let f = |section: usize, index: usize| shape.field(section as isize, index);
        let firstlineno = offset(f(CODE, 5), 4)?;
        ensure!(
            offset(f(CODE, 7), 8)? == firstlineno + FIRSTLINENO_TO_LOCALSPLUSNAMES,
            "_Py_DebugOffsets: co_localsplusnames is not 7 ints past co_firstlineno: \
             co_version is not where bpfprof reads it"
        );
        let gil_state = offset(f(INTERP, shape.gil + 1), 8)?;
        let in_gil = |at, width, what| -> Result<u32> {
            offset(at, width)?
                .checked_sub(gil_state)
                .ok_or_else(|| anyhow!("_Py_DebugOffsets: GIL's {what} before the GIL"))
        };
        // The offsets of the fields of the interpreter's own `_gil` in `PyInterpreterState`;
        // `ceval.gil` points to that struct (to the main interpreter's for interpreters that
        // share its GIL).
        let interp_gil = offset(f(INTERP, shape.gil), 8)?;
        let locked = in_gil(f(INTERP, shape.gil + 3), 8, "locked")?;
        let last_holder = in_gil(f(INTERP, shape.gil + 4), 8, "holder")?;
        let gil = if free_threaded {
            // `enabled` is the first field of a free-threaded build's `_gil_runtime_state`
            // (`pycore_gil.h`); 3.13t states its offset as 0 (3.13.5's
            // `gil_runtime_state_enabled`), so 0 is read as that first field.
            let at = f(INTERP, shape.gil + 2);
            let enabled = if field(at.0) == 0 {
                0
            } else {
                in_gil(at, 4, "enabled")?
            };
            ensure!(
                enabled + 4 <= last_holder.min(locked),
                "_Py_DebugOffsets: the free-threaded GIL's enabled flag is not before its \
                 holder and locked fields"
            );
            GilLayout::FreeThreaded {
                interp_gil,
                enabled,
                locked,
                last_holder,
            }
        } else {
            GilLayout::PerInterpreter {
                interp_gil,
                locked,
                last_holder,
            }
        };
        // Free-threaded 3.14+: where a frame says which thread-local copy of its code's
        // bytecode it runs, and where the code object keeps the copies.
        let (frame_tlbc_index, code_tlbc) = if free_threaded && shape.tlbc {
            let index = offset(f(FRAME, 7), 4)?;
            let copies = offset(f(CODE, 10), 8)?;
            ensure!(
                index != 0 && copies != 0,
                "_Py_DebugOffsets: a free-threaded build without tlbc_index or co_tlbc"
            );
            (index, copies)
        } else {
            (0, 0)
        };
        let unicode_ascii_size = offset(shape.field(-1, 3), 8)?;
        // 3.14 made `f_executable` a `_PyStackRef` (a tagged pointer): the kernel and
        // userspace clear `PYTHON_STACKREF_TAG_BITS` before following it, as for any version.
        Ok(Layout {
            kernel: PythonProcess {
                tstate_frame: offset(f(TSTATE, 4), 8)?,
                cframe_current_frame: NO_CFRAME,
                frame_previous: offset(f(FRAME, 1), 8)?,
                frame_code: offset(f(FRAME, 2), 8)?,
                frame_instr: offset(f(FRAME, 3), 8)?,
                instr_rule: PythonInstrRule::Pointer as u32,
                frame_entry: offset(f(FRAME, 5), 1)?,
                // The eval loop's entry frame: owner 3 in 3.12 and 3.13
                // (`FRAME_OWNED_BY_CSTACK`) and in 3.14 and 3.15 (renamed
                // `FRAME_OWNED_BY_INTERPRETER`; 3.15's thread's base frame has it too).
                entry_rule: PythonEntryRule::ShimFrame as u32,
                code_instructions: offset(f(CODE, 9), 2)?,
                version: 0x0300 | minor as u32,
                gil_holder: 0,
                gil_locked: 0,
                frame_window: DATA_STACK_WINDOW,
                // co_nfreevars and co_version, as for 3.12.
                code_identity: firstlineno + FIRSTLINENO_TO_IDENTITY,
                code_identity_deref: 0,
                frame_tlbc_index,
                code_tlbc,
                free_threaded: free_threaded as u32,
                // Set when the process's `_asyncio` is found (3.14+).
                tstate_running_task: 0,
                task_coro: 0,
            },
            runtime_interpreters_head: offset(f(RUNTIME, 2), 8)?,
            interp_next: offset(f(INTERP, 2), 8)?,
            interp_threads_head: offset(f(INTERP, 3), 8)?,
            tstate_next: offset(f(TSTATE, 2), 8)?,
            tstate_thread_id: offset(f(TSTATE, shape.thread_id), 8)?,
            tstate_native_thread_id: Some(offset(f(TSTATE, shape.thread_id + 1), 8)?),
            code_filename: offset(f(CODE, 1), 8)?,
            code_name: offset(f(CODE, 2), 8)?,
            code_qualname: Some(offset(f(CODE, 3), 8)?),
            code_firstlineno: firstlineno,
            code_linetable: offset(f(CODE, 4), 8)?,
            object_type: offset(f(OBJECT, 1), 8)?,
            type_name: offset(f(TYPE, 1), 8)?,
            unicode_length: offset(shape.field(-1, 2), 8)?,
            unicode_state: offset(shape.field(-1, 1), 4)?,
            // A size, not an offset: `PyUnicodeObject` (whose size its section states) is a
            // `PyCompactUnicodeObject` and a data pointer, so 8 bytes at least follow it.
            unicode_ascii_size,
            unicode_compact_size: unicode_ascii_size + COMPACT_EXTRA,
            bytes_size: offset(shape.field(-2, 1), 8)?,
            bytes_data: offset(shape.field(-2, 2), 1)?,
            line_format: LineTableFormat::Locations,
            gil,
            free_threaded,
            unicode_kind_shift: if free_threaded && minor >= 14 {
                unicode_state::FREE_THREADED_KIND_SHIFT
            } else {
                unicode_state::KIND_SHIFT
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
    /// The same of the free-threaded 3.13.5 `cargo xtask setup` builds (`/opt/py313t`).
    const FT_313: &[u8] = include_bytes!("testdata/debug_offsets_3.13t.bin");

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
    fn a_mismatched_version_is_refused_with_the_reason() {
        // 3.14's offsets in an interpreter that says it is 3.15.
        let e = Layout::from_debug_offsets(SID_314, (3, 15)).unwrap_err();
        assert!(e.to_string().contains("says version 3.14"), "{e}");
        // A GIL build's offsets (16-byte object header) under a free-threaded flag.
        let mut blob = SID_314.to_vec();
        put(&mut blob, DEBUG_FREE_THREADED, 1);
        let e = Layout::from_debug_offsets(&blob, (3, 14)).unwrap_err();
        assert!(
            e.to_string()
                .contains("sizeof(PyObject) at byte 400 is 16, not 32"),
            "{e}"
        );
        // A version before 3.13 never has debug offsets.
        let mut blob = SID_314.to_vec();
        put(&mut blob, DEBUG_VERSION, 0x030c00f0);
        let e = Layout::from_debug_offsets(&blob, (3, 12)).unwrap_err();
        assert!(
            e.to_string()
                .contains("laid out as no version bpfprof knows"),
            "{e}"
        );
    }

    /// `blob` made to say it is 3.16.0 (final).
    fn as_316(blob: &[u8]) -> Vec<u8> {
        let mut blob = blob.to_vec();
        put(&mut blob, DEBUG_VERSION, 0x031000f0);
        blob
    }

    #[test]
    fn a_later_version_with_a_known_shape_is_walked_with_its_own_offsets() {
        // sid's 3.15 and 3.14 saying they are 3.16: each struct has its own version's shape
        // and passes every check, so the offsets are its own (the newest shape that fits).
        for (blob, minor) in [(SID_315, 15), (SID_314, 14)] {
            let known = Layout::from_debug_offsets(blob, (3, minor)).unwrap();
            let later = Layout::from_debug_offsets(&as_316(blob), (3, 16))
                .unwrap_or_else(|e| panic!("3.{minor}'s shape as 3.16: {e:#}"));
            assert_eq!(later.kernel.version, 0x0310);
            let mut expected = known.clone();
            expected.kernel.version = 0x0310;
            assert_eq!(later, expected, "3.{minor}'s shape");
        }
    }

    #[test]
    fn a_later_version_of_a_changed_shape_is_refused_with_the_reason() {
        // 3.15's struct with a field added to the thread's section (as 3.15 added some):
        // every section after it moves by 8 bytes, which no known shape describes.
        let mut blob = as_316(SID_315);
        let frame = 312;
        blob.copy_within(frame..DEBUG_OFFSETS_SIZE - 8, frame + 8);
        put(&mut blob, frame, 400);
        let e = Layout::from_debug_offsets(&blob, (3, 16)).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("laid out as no version bpfprof knows"), "{e}");
        // Each known shape was tried, newest first, and each refusal says why.
        let (at15, at14, at13) = (
            e.find("as 3.15's: ").expect(&e),
            e.find("as 3.14's: ").expect(&e),
            e.find("as 3.13's: ").expect(&e),
        );
        assert!(at15 < at14 && at14 < at13, "{e}");
        // A section bpfprof does not read (3.15's heap type section) two fields longer:
        // the bytes and unicode sections move, and the anchors catch it.
        let mut blob = as_316(SID_315);
        blob.copy_within(544..DEBUG_OFFSETS_SIZE - 16, 560);
        put(&mut blob, 544, 0);
        put(&mut blob, 552, 0);
        let e = Layout::from_debug_offsets(&blob, (3, 16)).unwrap_err();
        assert!(e.to_string().contains("as 3.15's: "), "{e}");
        // A known version whose struct lost its shape is refused as such, not read wrongly.
        let mut blob = SID_315.to_vec();
        blob.copy_within(frame..DEBUG_OFFSETS_SIZE - 8, frame + 8);
        let e = Layout::from_debug_offsets(&blob, (3, 15)).unwrap_err();
        assert!(e.to_string().contains("_Py_DebugOffsets: "), "{e}");
    }

    /// 3.14's struct as a free-threaded 3.14t build fills it: the struct is the same (only
    /// values change under `Py_GIL_DISABLED`, `pycore_debug_offsets.h`); the values that
    /// differ are those of the longer object header (`PyObject` 32 bytes, `ob_type` at 24,
    /// every object's fields 16 bytes later), `tlbc_index` (frame field 7) and `co_tlbc` (code
    /// field 10), 0 in a GIL build. The exact offsets of 3.14t's frame and code fields are
    /// illustrative (no 3.14t can be installed here); what is checked is where they are read
    /// from and what follows from them.
    fn as_314t() -> Vec<u8> {
        let mut blob = SID_314.to_vec();
        put(&mut blob, DEBUG_FREE_THREADED, 1);
        // interpreter: the GIL fields hold what a free-threaded build's `_gil` has, unused.
        // frame (248): size, previous, executable, instr_ptr, localsplus, owner,
        // stackpointer, tlbc_index (an int32 after `stackpointer`).
        for (i, v) in [88, 8, 0, 56, 80, 78, 64, 72].into_iter().enumerate() {
            put(&mut blob, 248 + 8 * i, v);
        }
        // code (312): every field 16 bytes later; `co_tlbc` a pointer inside the object.
        for (i, v) in [240, 128, 136, 144, 152, 84, 68, 112, 120, 232, 224]
            .into_iter()
            .enumerate()
        {
            put(&mut blob, 312 + 8 * i, v);
        }
        // object (400), type (416): the header and what follows it.
        put(&mut blob, 400, 32);
        put(&mut blob, 408, 24);
        put(&mut blob, 416, 432);
        put(&mut blob, 424, 40);
        // bytes (592): ob_size after the header, ob_sval after ob_shash.
        for (i, v) in [56, 32, 48].into_iter().enumerate() {
            put(&mut blob, 592 + 8 * i, v);
        }
        // unicode (616): size, state, length, sizeof(PyASCIIObject).
        for (i, v) in [80, 48, 32, 56].into_iter().enumerate() {
            put(&mut blob, 616 + 8 * i, v);
        }
        blob
    }

    #[test]
    fn the_layout_of_3_13t_from_its_own_offsets() {
        let l = Layout::from_debug_offsets(FT_313, (3, 13)).expect("3.13t's offsets pass");
        assert!(l.free_threaded);
        // Its `_gil`: `enabled` first (stated as 0 by 3.13t), then `interval`, `last_holder`
        // and `locked`, as in `pycore_gil.h` under `Py_GIL_DISABLED`.
        assert_eq!(
            l.gil,
            GilLayout::FreeThreaded {
                interp_gil: 16,
                enabled: 0,
                locked: 24,
                last_holder: 16
            }
        );
        let k = l.kernel;
        assert_eq!(
            (k.free_threaded, k.frame_tlbc_index, k.code_tlbc),
            (1, 0, 0)
        );
        // The longer object header: `ob_type` at 24, and every object's fields 16 bytes later.
        assert_eq!((l.object_type, l.type_name), (24, 40));
        assert_eq!(
            (l.code_filename, l.code_name, l.code_qualname),
            (128, 136, Some(144))
        );
        assert_eq!((l.code_firstlineno, k.code_identity), (84, 104));
        assert_eq!(k.code_instructions, 216);
        assert_eq!((l.bytes_size, l.bytes_data), (32, 48));
        assert_eq!(
            (l.unicode_length, l.unicode_state, l.unicode_ascii_size),
            (32, 48, 56)
        );
        // 3.13t keeps `interned:2` a bit field: the kind bits where a GIL build has them.
        assert_eq!(l.unicode_kind_shift, unicode_state::KIND_SHIFT);
        // The frame is a GIL build's.
        assert_eq!(
            (k.frame_code, k.frame_previous, k.frame_instr, k.frame_entry),
            (0, 8, 56, 70)
        );
        // A 3.16t of 3.13t's shape is walked with its offsets too.
        let l16 = Layout::from_debug_offsets(&as_316(FT_313), (3, 16)).expect("3.13t's shape");
        assert_eq!(l16.object_type, 24);
        assert!(l16.free_threaded);
    }

    #[test]
    fn free_threaded_offsets_are_read_from_the_same_struct() {
        let l = Layout::from_debug_offsets(&as_314t(), (3, 14)).expect("3.14t's offsets pass");
        assert!(l.free_threaded);
        assert!(matches!(l.gil, GilLayout::FreeThreaded { enabled: 0, .. }));
        // 3.14t states where `enabled` is: read from there.
        let mut stated = as_314t();
        let gil_state = u64::from_ne_bytes(stated[128..136].try_into().unwrap());
        put(&mut stated, 136, gil_state);
        let l = Layout::from_debug_offsets(&stated, (3, 14)).expect("enabled stated");
        assert!(matches!(l.gil, GilLayout::FreeThreaded { enabled: 0, .. }));
        // One stated past the holder is refused.
        put(&mut stated, 136, gil_state + 24);
        let e = Layout::from_debug_offsets(&stated, (3, 14)).unwrap_err();
        assert!(e.to_string().contains("enabled flag"), "{e}");
        let k = l.kernel;
        assert_eq!(k.free_threaded, 1);
        assert_eq!((k.frame_tlbc_index, k.code_tlbc), (72, 224));
        assert_eq!(
            (k.frame_instr, k.frame_entry, k.code_instructions),
            (56, 78, 232)
        );
        // co_nfreevars and co_version, 20 bytes past co_firstlineno as in a GIL build.
        assert_eq!((l.code_firstlineno, k.code_identity), (84, 104));
        assert_eq!((l.object_type, l.type_name), (24, 40));
        assert_eq!((l.bytes_size, l.bytes_data), (32, 48));
        assert_eq!((l.unicode_length, l.unicode_state), (32, 48));
        assert_eq!((l.unicode_ascii_size, l.unicode_compact_size), (56, 72));
        // 3.14t's `interned` is a whole byte: the kind bits start at bit 8.
        assert_eq!(
            l.unicode_kind_shift,
            unicode_state::FREE_THREADED_KIND_SHIFT
        );
        // The same as 3.15t, and as a 3.16t of 3.14's shape.
        let mut later = as_314t();
        put(&mut later, DEBUG_VERSION, 0x031000f0);
        let l16 = Layout::from_debug_offsets(&later, (3, 16)).expect("3.16t of 3.14t's shape");
        assert_eq!(
            (l16.kernel.frame_tlbc_index, l16.kernel.code_tlbc),
            (72, 224)
        );
        // A free-threaded 3.14+ without per-thread bytecode offsets would name wrong lines.
        let mut blob = as_314t();
        put(&mut blob, 248 + 8 * 7, 0);
        let e = Layout::from_debug_offsets(&blob, (3, 14)).unwrap_err();
        assert!(e.to_string().contains("without tlbc_index"), "{e}");
        // A GIL build ignores the (zero) per-thread bytecode fields and keeps its GIL.
        let gil = Layout::from_debug_offsets(SID_314, (3, 14)).unwrap();
        assert!(!gil.free_threaded);
        assert_eq!((gil.kernel.frame_tlbc_index, gil.kernel.code_tlbc), (0, 0));
        assert_eq!(gil.unicode_kind_shift, unicode_state::KIND_SHIFT);
    }
}
