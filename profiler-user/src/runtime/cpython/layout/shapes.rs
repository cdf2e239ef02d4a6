//! The shapes of `_Py_DebugOffsets` bpfprof knows (3.13-3.15) and the checks a target's
//! struct must pass against one before any of its offsets is used.

use super::*;

/// The shape of one version's `_Py_DebugOffsets` (all `u64`s after the cookie, version and
/// `free_threaded` words): how many fields each of its sections has, from `runtime_state` to
/// `unicode_object` (the last bpfprof reads), each section's first field the `sizeof` of the
/// struct its other fields are offsets into; and where in their sections the fields that
/// moved between versions are. From `Include/internal/pycore_debug_offsets.h` of each
/// release, checked against Debian's and pyenv's interpreters and the 3.13t built here. The
/// struct is the same in GIL and free-threaded builds: `Py_GIL_DISABLED` changes only the
/// values (3.14's `tlbc_index` and `co_tlbc` are 0 in a GIL build).
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    /// The version it is 3.`minor`'s shape of.
    pub(super) minor: u8,
    /// Fields per section: runtime, interpreter, thread, frame, code, object, type, then
    /// sections bpfprof does not read, then bytes and unicode (the last two).
    pub(super) sections: &'static [usize],
    /// Index of `ceval_gil` in the interpreter's section (3.14 put `threads_main` before it).
    pub(super) gil: usize,
    /// Index of `thread_id` in the thread's section (3.15 put three pointers before it).
    pub(super) thread_id: usize,
    /// Whether the frame's section has `tlbc_index` (its field 7) and the code's `co_tlbc`
    /// (its field 10): 3.14 on.
    pub(super) tlbc: bool,
}

/// The shapes bpfprof knows, oldest first.
pub(super) const SHAPES: [Shape; 3] = [
    Shape {
        minor: 13,
        sections: &[3, 13, 9, 6, 10, 2, 4, 3, 3, 3, 2, 3, 3, 4],
        gil: 8,
        thread_id: 5,
        tlbc: false,
    },
    // 3.14 added `threads_main`, `code_object_generation` and `tlbc_generation` to the
    // interpreter's section, `stackpointer` and `tlbc_index` to the frame's, `co_tlbc` to
    // the code's, and a set section before the dict's.
    Shape {
        minor: 14,
        sections: &[3, 16, 9, 8, 11, 2, 4, 3, 3, 4, 3, 2, 3, 3, 4],
        gil: 9,
        thread_id: 5,
        tlbc: true,
    },
    // 3.15 added 8 thread fields, `tp_basicsize` and `tp_dictoffset` to the type's section
    // and a heap type section after it.
    Shape {
        minor: 15,
        sections: &[3, 16, 17, 8, 11, 2, 6, 2, 3, 3, 4, 3, 2, 3, 3, 4],
        gil: 9,
        thread_id: 8,
        tlbc: true,
    },
];

/// Byte positions in `_Py_DebugOffsets` of its version and free-threading fields (all
/// versions), and of its first section.
pub(super) const DEBUG_VERSION: usize = 8;
pub(super) const DEBUG_FREE_THREADED: usize = 16;
pub(super) const DEBUG_SECTIONS: usize = 24;

/// Sections of every [`Shape`] by their index.
pub(super) const RUNTIME: usize = 0;
pub(super) const INTERP: usize = 1;
pub(super) const TSTATE: usize = 2;
pub(super) const FRAME: usize = 3;
pub(super) const CODE: usize = 4;
pub(super) const OBJECT: usize = 5;
pub(super) const TYPE: usize = 6;

impl Shape {
    /// Where section `index` starts (negative: from the end, -1 the unicode section).
    pub(super) fn section(&self, index: isize) -> usize {
        let index = if index < 0 {
            (self.sections.len() as isize + index) as usize
        } else {
            index as usize
        };
        DEBUG_SECTIONS + 8 * self.sections[..index].iter().sum::<usize>()
    }

    /// Field `field` of section `index`, with the position of its section's size.
    pub(super) fn field(&self, index: isize, field: usize) -> (usize, usize) {
        let start = self.section(index);
        (start + 8 * field, start)
    }

    /// Bytes of `_Py_DebugOffsets` up to the end of its unicode section.
    pub(super) fn span(&self) -> usize {
        DEBUG_SECTIONS + 8 * self.sections.iter().sum::<usize>()
    }
}

/// `sizeof(PyObject)` of a GIL build and of a free-threaded one (`ob_tid`, `ob_flags`,
/// `ob_mutex`, `ob_gc_bits`, `ob_ref_local`, `ob_ref_shared` before `ob_type`).
pub(super) const OBJECT_SIZE: u64 = 16;
pub(super) const FREE_THREADED_OBJECT_SIZE: u64 = 32;

/// Whether `raw` has `shape`'s shape: each section starts with a plausible struct size (not
/// 0, 8-aligned, below [`MAX_STATED_SIZE`]) that each of its other fields lies below, and the
/// sections every version has keep their anchors: `sizeof(PyObject)` is 16 (32 in a
/// free-threaded build) with `ob_type` last, and `tp_name`, `PyBytesObject.ob_size` and
/// `PyASCIIObject.length` follow the object header as they always have. A struct that gained
/// or lost a field before these sections moves them, and fails here.
pub(super) fn check_shape(raw: &[u8], shape: &Shape, free_threaded: bool) -> Result<()> {
    let field = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
    ensure!(
        shape.span() <= raw.len(),
        "_Py_DebugOffsets: 3.{}'s shape spans {} bytes",
        shape.minor,
        shape.span()
    );
    for (index, &fields) in shape.sections.iter().enumerate() {
        let start = shape.section(index as isize);
        let size = field(start);
        ensure!(
            size > 0 && size <= MAX_STATED_SIZE && size.is_multiple_of(8),
            "_Py_DebugOffsets: implausible struct size {size:#x} at byte {start}, where \
             3.{}'s section {index} starts",
            shape.minor
        );
        for at in (1..fields).map(|f| start + 8 * f) {
            ensure!(
                field(at) < size,
                "_Py_DebugOffsets: offset {:#x} at byte {at} is past its struct's {size} \
                 bytes (3.{}'s section {index})",
                field(at),
                shape.minor
            );
        }
    }
    let header = if free_threaded {
        FREE_THREADED_OBJECT_SIZE
    } else {
        OBJECT_SIZE
    };
    let anchors = [
        ("sizeof(PyObject)", shape.field(OBJECT as isize, 0), header),
        (
            "PyObject.ob_type",
            shape.field(OBJECT as isize, 1),
            header - 8,
        ),
        (
            "PyTypeObject.tp_name",
            shape.field(TYPE as isize, 1),
            header + 8,
        ),
        ("PyBytesObject.ob_size", shape.field(-2, 1), header),
        ("PyASCIIObject.length", shape.field(-1, 2), header),
    ];
    for (what, (at, _), expected) in anchors {
        ensure!(
            field(at) == expected,
            "_Py_DebugOffsets: {what} at byte {at} is {}, not {expected} as in every {} build \
             (3.{}'s shape)",
            field(at),
            if free_threaded {
                "free-threaded"
            } else {
                "GIL"
            },
            shape.minor
        );
    }
    Ok(())
}

/// Bytes a `PyCompactUnicodeObject` adds to a `PyASCIIObject` in 3.12 and later: `utf8_length`
/// and the `utf8` pointer (`_Py_DebugOffsets` gives only the ASCII header's size).
pub(super) const COMPACT_EXTRA: u32 = 16;

/// Largest struct size `_Py_DebugOffsets` may state: `_PyRuntimeState` is about 300 KiB and
/// `PyInterpreterState` 220 KiB in 3.14; 16 MiB is no real interpreter's.
pub(super) const MAX_STATED_SIZE: u64 = 1 << 24;

/// `co_nfreevars` and `co_version` (the identity word, see
/// [`PythonProcess::code_identity`]) follow `co_firstlineno` after `co_nlocalsplus`,
/// `co_framesize`, `co_nlocals` and `co_ncellvars` (`code.h` of 3.12 to 3.15), and
/// `co_localsplusnames` follows them: 7 `int`s from `co_firstlineno` on.
pub(super) const FIRSTLINENO_TO_IDENTITY: u32 = 20;
pub(super) const FIRSTLINENO_TO_LOCALSPLUSNAMES: u32 = 28;
