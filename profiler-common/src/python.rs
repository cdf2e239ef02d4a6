//! CPython: what the kernel needs per process to walk Python frames, and how it packs them.

/// Processes whose Python frames the kernel program can walk at once.
pub const MAX_PYTHON_PROCESSES: u32 = 1024;
/// Python threads (over all processes) the kernel program knows the thread state of.
pub const MAX_PYTHON_THREADS: u32 = 16384;

/// How a CPython version marks where one `_PyEval_EvalFrameDefault` call's frames end.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PythonEntryRule {
    /// Every frame is its own eval call (3.10: `PyFrameObject`s, one C call each).
    EveryFrame = 0,
    /// A byte at [`PythonProcess::frame_entry`] is non-zero in an eval call's first frame
    /// (3.11's `is_entry`).
    EntryFlag = 1,
    /// Each eval call links a shim frame whose owner byte at [`PythonProcess::frame_entry`] is
    /// [`PYTHON_FRAME_OWNED_BY_CSTACK`] (3.12 and later); the shim itself is not a frame.
    ShimFrame = 2,
}

/// Bytes of a frame the kernel reads at once: every field of [`PythonProcess`] that is read
/// from a frame must end within them (3.10's `f_lasti`, the farthest, ends at byte 100), and
/// pointer fields must be 8-aligned, `int`s 4-aligned (the kernel takes them from whole words).
pub const PYTHON_FRAME_BYTES: usize = 104;

/// Most bytes of memory the kernel copies at once for the Python walk
/// ([`PythonProcess::frame_window`]): 3.11 and later keep a thread's frames one after another
/// on its data stack, each caller just below its callee (about 130 bytes for a function with a
/// few locals), so one copy of the 1 KiB below a frame holds its next callers too.
pub const PYTHON_FRAME_WINDOW_BYTES: usize = 1024;

/// The owner value of the frame each eval call links first (3.12 and 3.13's
/// `FRAME_OWNED_BY_CSTACK`, 3.14 and 3.15's `FRAME_OWNED_BY_INTERPRETER`, which 3.15's
/// thread's base frame also has).
pub const PYTHON_FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Tag bits of a `_PyStackRef` (3.14+'s `f_executable`): 3.14 tags deferred references in
/// bit 0, 3.15 uses bits 0-1 (`Py_TAG_BITS`). Cleared before the pointer is followed; the
/// plain pointers of earlier versions have them clear (objects are at least 8-aligned).
pub const PYTHON_STACKREF_TAG_BITS: u64 = 3;

/// How a CPython version records a frame's current instruction.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PythonInstrRule {
    /// A C `int` holding the instruction's index in code units (3.10's `f_lasti`).
    LastiIndex = 0,
    /// A pointer into the code object's instructions, which start at
    /// [`PythonProcess::code_instructions`] (3.11's and 3.12's `prev_instr`, 3.13's `instr_ptr`).
    Pointer = 1,
}

/// A Python thread the kernel program walks, by host tid: its thread state and the process
/// it belongs to. Thread ids are reused (pid_max is 32768 on many machines, and a busy one
/// wraps it in minutes) while an ended thread's entry may stay until its process's threads
/// are listed again: an entry whose `tgid` is not the sampled process's is another
/// process's, never walked (its address read in this process's memory gave frames of
/// garbage, which hid the thread from the listing that would have replaced the entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PythonThread {
    /// The thread's `PyThreadState` address.
    pub tstate: u64,
    /// Its process's host tgid.
    pub tgid: u32,
    pub _pad: u32,
}

/// What the kernel program needs to walk one CPython process's frames: byte offsets of the
/// interpreter's structures for its version. Userspace fills it per process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PythonProcess {
    /// Offset in `PyThreadState` of the pointer to the current frame (3.10 `frame`, 3.13
    /// `current_frame`) or to the current `_PyCFrame` (3.11 and 3.12 `cframe`).
    pub tstate_frame: u32,
    /// Offset of `current_frame` in `_PyCFrame` when `tstate_frame` points to one, else
    /// `u32::MAX` (the pointer is the frame itself).
    pub cframe_current_frame: u32,
    /// Offset of the caller's frame pointer in a frame (`previous`, 3.10 `f_back`).
    pub frame_previous: u32,
    /// Offset of the code object pointer in a frame (`f_code`, 3.13 `f_executable`).
    pub frame_code: u32,
    /// Offset of the current instruction in a frame (see `instr_rule`).
    pub frame_instr: u32,
    /// A [`PythonInstrRule`] value.
    pub instr_rule: u32,
    /// Offset of the byte [`PythonEntryRule`] reads (`is_entry`, `owner`); unused for
    /// [`PythonEntryRule::EveryFrame`].
    pub frame_entry: u32,
    /// A [`PythonEntryRule`] value.
    pub entry_rule: u32,
    /// Offset of the first instruction in a code object (`co_code_adaptive`; 0 for 3.10).
    pub code_instructions: u32,
    /// CPython's version, `major << 8 | minor` (0x030c for 3.12); for userspace and bpftool.
    pub version: u32,
    /// Address of the GIL's `last_holder` (the `PyThreadState` that last took it), or 0 when
    /// unknown (then no sample says whether its thread held the GIL).
    pub gil_holder: u64,
    /// Address of the GIL's `locked` flag (a C `int`); read with `gil_holder`, in the same
    /// read where it follows it (at `gil_holder + 8`, as in every version's
    /// `_gil_runtime_state`).
    pub gil_locked: u64,
    /// Bytes the kernel copies at once to read a frame: the frame's [`PYTHON_FRAME_BYTES`]
    /// and up to this many bytes in all below them (never below the frame's page, which is
    /// mapped since the frame is), from which its callers are read while they lie there.
    /// [`PYTHON_FRAME_BYTES`] for 3.10, whose frames are separate heap objects;
    /// [`PYTHON_FRAME_WINDOW_BYTES`] at most.
    pub frame_window: u32,
    /// Offset in a code object of the 8 bytes the kernel reads to tell code objects at one
    /// address apart ([`PythonFrame::identity_of`]): `co_nfreevars` and `co_version` (3.12
    /// and later, which number each code object), `co_name` (3.10, 3.11).
    pub code_identity: u32,
    /// When not 0, those 8 bytes are a pointer, and the identity word is the 8 bytes this
    /// far into the object it points to: `co_name`'s cached string hash (3.10, 3.11), which,
    /// unlike the name's address, a new name at a freed name's address does not keep.
    pub code_identity_deref: u32,
    /// Offset in a frame of its `tlbc_index` (a C `int32_t`: which thread-local copy of its
    /// code's bytecode the frame runs), or 0 where the build has none (GIL builds, 3.13t):
    /// free-threaded 3.14+ give each thread its own copy of the bytecode it specializes, and
    /// `instr_ptr` points into that copy, not into `co_code_adaptive`.
    pub frame_tlbc_index: u32,
    /// Offset in a code object of `co_tlbc`, the pointer to its `_PyCodeArray` of
    /// thread-local copies (`Py_ssize_t size; char *entries[]`, entry 0 the code object's
    /// own `co_code_adaptive`); 0 with `frame_tlbc_index`.
    pub code_tlbc: u32,
    /// Non-zero for a free-threaded (no-GIL) build: the kernel appends
    /// [`PythonFrame::NO_GIL`] to its stacks where a GIL build's get a GIL entry.
    pub free_threaded: u32,
    /// Offset in the thread state of `asyncio_running_task` (CPython 3.14+: the asyncio task
    /// the thread runs, or NULL), or 0: the kernel records no task. Where set, a stack whose
    /// thread runs a task ends with [`PythonFrame::task_entry`] and the task's address.
    pub tstate_running_task: u32,
    /// Offset in a task of its coroutine pointer, whose identity bits the task entry keeps
    /// (a task freed and another put at its address has another coroutine).
    pub task_coro: u32,
}

/// One Python frame as the kernel records it in a Python stack: the code object's address,
/// the instruction index and a few bits of the code object's identity packed into 64 bits,
/// plus whether the frame is the first one of an `_PyEval_EvalFrameDefault` call (where the
/// native stack has that C function).
///
/// Bits 0-42: the code object's address divided by 16 (CPython allocates objects 16-aligned
/// on 64-bit machines, pymalloc and malloc alike, and user addresses fit 47 bits); bits
/// 43-55: the instruction index in code units, saturated at [`PythonFrame::MAX_INSTRUCTION`];
/// bits 56-62: the identity ([`PythonFrame::identity_of`]); bit 63: the eval-entry flag.
///
/// The identity is there because CPython frees code objects and puts others at their
/// addresses (code made by `exec`, `compile`, or reloaded): without it the new function's
/// frames are the old one's, one stack and one name for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PythonFrame {
    /// Address of the frame's code object in the target's memory.
    pub code: u64,
    /// Index of the current instruction in code units (2 bytes each).
    pub instruction: u32,
    /// [`PythonFrame::identity_of`] the code object's identity word when the frame was read.
    pub identity: u8,
    /// Whether this frame is the first (outermost) of one `_PyEval_EvalFrameDefault` call.
    pub eval_entry: bool,
}

impl PythonFrame {
    /// Largest instruction index a packed frame holds (16 KiB of bytecode, more than all
    /// but generated functions have); larger ones are clamped to it, and their line is the
    /// function's first.
    pub const MAX_INSTRUCTION: u32 = (1 << 13) - 1;
    const CODE_BITS: u32 = 43;
    const CODE_SHIFT: u32 = 4;
    const INSTRUCTION_BITS: u32 = 13;
    const IDENTITY_SHIFT: u32 = Self::CODE_BITS + Self::INSTRUCTION_BITS;
    /// Bits of identity a frame keeps: a code object put where another was is told apart
    /// from it about 125 times in 126 (0 is [`PythonFrame::UNKNOWN_IDENTITY`], and 1 takes
    /// its words).
    pub const IDENTITY_MASK: u8 = 0x7f;
    const ENTRY_BIT: u64 = 1 << 63;

    /// The identity bits of a frame whose code object's identity word could not be had: the
    /// read failed, or (3.10, 3.11) the name's hash was not computed yet. Such a frame is
    /// named after whatever object is at its address, as all were before identity bits;
    /// [`PythonFrame::identity_of`] never gives it.
    pub const UNKNOWN_IDENTITY: u8 = 0;

    /// What a `str`'s cached hash is until something hashes it (3.10, 3.11 names): a word
    /// that changes later, so that frames recorded before and after would differ.
    pub const HASH_NOT_COMPUTED: u64 = u64::MAX;

    /// The identity bits of a code object whose identity word ([`PythonProcess`]'s
    /// `code_identity` field) is `word`: the top bits of MurmurHash3's 64-bit finalizer of
    /// it, in which every bit of the word moves them (a pointer's low bits are alignment, a
    /// version counter's high bits rarely change); 1 where they are 0, which is
    /// [`PythonFrame::UNKNOWN_IDENTITY`].
    #[inline(always)]
    pub const fn identity_of(word: u64) -> u8 {
        let mut x = word;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        let bits = (x >> 57) as u8 & Self::IDENTITY_MASK;
        if bits == Self::UNKNOWN_IDENTITY {
            1
        } else {
            bits
        }
    }

    /// Whether a frame recorded with identity bits `frame` may be named after an object
    /// whose bits are `object`: when they are equal, or either is unknown.
    #[inline(always)]
    pub const fn identities_match(frame: u8, object: u8) -> bool {
        frame == object || frame == Self::UNKNOWN_IDENTITY || object == Self::UNKNOWN_IDENTITY
    }

    /// Packs the frame into one stack entry.
    #[inline(always)]
    pub const fn pack(code: u64, instruction: u32, identity: u8, eval_entry: bool) -> u64 {
        let instruction = if instruction > Self::MAX_INSTRUCTION {
            Self::MAX_INSTRUCTION
        } else {
            instruction
        };
        let mut v = ((code >> Self::CODE_SHIFT) & ((1 << Self::CODE_BITS) - 1))
            | ((instruction as u64) << Self::CODE_BITS)
            | (((identity & Self::IDENTITY_MASK) as u64) << Self::IDENTITY_SHIFT);
        if eval_entry {
            v |= Self::ENTRY_BIT;
        }
        v
    }

    /// The entry the kernel appends, outermost, to the Python stack of a thread that holds the
    /// GIL (code address 0 is never a frame).
    pub const GIL_HELD: u64 = 1 << Self::CODE_BITS;
    /// The entry appended to the Python stack of a thread that does not hold the GIL.
    pub const GIL_NOT_HELD: u64 = 2 << Self::CODE_BITS;
    /// The entry appended to the Python stack of a thread of a free-threaded build, which
    /// has no GIL to hold.
    pub const NO_GIL: u64 = 3 << Self::CODE_BITS;

    /// The entry the kernel appends, after the GIL entry, to the Python stack of a thread
    /// that runs an asyncio task, with the task coroutine's identity bits
    /// ([`PythonFrame::identity_of`] its address); the task's address follows it, last.
    #[inline(always)]
    pub const fn task_entry(identity: u8) -> u64 {
        (4 << Self::CODE_BITS) | (((identity & Self::IDENTITY_MASK) as u64) << Self::IDENTITY_SHIFT)
    }

    /// The identity bits of a task entry, or `None` for any other entry.
    #[inline(always)]
    pub const fn task_entry_identity(packed: u64) -> Option<u8> {
        let low =
            packed & !(((Self::IDENTITY_MASK as u64) << Self::IDENTITY_SHIFT) | Self::ENTRY_BIT);
        if low == 4 << Self::CODE_BITS {
            Some((packed >> Self::IDENTITY_SHIFT) as u8 & Self::IDENTITY_MASK)
        } else {
            None
        }
    }

    /// Whether a packed entry is one of the kernel's GIL entries (outermost), not a frame.
    #[inline(always)]
    pub const fn is_gil_entry(packed: u64) -> bool {
        packed == Self::GIL_HELD || packed == Self::GIL_NOT_HELD || packed == Self::NO_GIL
    }

    /// Marks a packed frame as the first of an eval call.
    #[inline(always)]
    pub const fn with_eval_entry(packed: u64) -> u64 {
        packed | Self::ENTRY_BIT
    }

    /// A packed frame without its eval-entry flag: what names it.
    #[inline(always)]
    pub const fn without_eval_entry(packed: u64) -> u64 {
        packed & !Self::ENTRY_BIT
    }

    /// Unpacks a stack entry.
    pub const fn unpack(packed: u64) -> PythonFrame {
        PythonFrame {
            code: (packed & ((1 << Self::CODE_BITS) - 1)) << Self::CODE_SHIFT,
            instruction: ((packed >> Self::CODE_BITS) as u32) & Self::MAX_INSTRUCTION,
            identity: (packed >> Self::IDENTITY_SHIFT) as u8 & Self::IDENTITY_MASK,
            eval_entry: packed & Self::ENTRY_BIT != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PythonFrame;

    #[test]
    fn task_entries_are_no_frame_and_no_gil_entry() {
        for identity in 0..=PythonFrame::IDENTITY_MASK {
            let entry = PythonFrame::task_entry(identity);
            assert_eq!(PythonFrame::task_entry_identity(entry), Some(identity));
            assert!(!PythonFrame::is_gil_entry(entry));
            // Code address 0: never a recorded frame.
            assert_eq!(PythonFrame::unpack(entry).code, 0);
        }
        for other in [
            PythonFrame::GIL_HELD,
            PythonFrame::NO_GIL,
            PythonFrame::pack(0x7f00_1234_5670, 4, 3, false),
        ] {
            assert_eq!(PythonFrame::task_entry_identity(other), None);
        }
    }

    #[test]
    fn python_frames_round_trip_and_saturate() {
        let code = 0x7fff_ffff_fff0u64;
        for identity in 0..=PythonFrame::IDENTITY_MASK {
            let f = PythonFrame::unpack(PythonFrame::pack(code, 1234, identity, true));
            assert_eq!(
                f,
                PythonFrame {
                    code,
                    instruction: 1234,
                    identity,
                    eval_entry: true
                }
            );
        }
        let f = PythonFrame::unpack(PythonFrame::pack(code, u32::MAX, 0xff, false));
        assert_eq!(f.instruction, PythonFrame::MAX_INSTRUCTION);
        assert_eq!(f.identity, PythonFrame::IDENTITY_MASK);
        assert_eq!(f.code, code);
        assert!(!f.eval_entry);
        let marked = PythonFrame::with_eval_entry(PythonFrame::pack(code, 7, 3, false));
        assert!(PythonFrame::unpack(marked).eval_entry);
        assert_eq!(
            PythonFrame::without_eval_entry(marked),
            PythonFrame::pack(code, 7, 3, false)
        );
    }

    #[test]
    fn identities_of_nearby_words_spread_over_every_value() {
        // Names are objects a few dozen bytes apart, 8- or 16-aligned; versions (3.12+) are
        // counted up in the word's high half, a few apart.
        let pointer = |i: u64| 0x7f00_0000_0000 + i * 48;
        let version = |i: u64| (900 + 2 * i) << 32;
        for word in [&pointer as &dyn Fn(u64) -> u64, &version] {
            let mut seen = [0u32; 128];
            for i in 0..1600 {
                seen[PythonFrame::identity_of(word(i)) as usize] += 1;
            }
            // 12.5 words a value on average; 1 takes 0's too, and 0 (unknown) none.
            assert_eq!(seen[0], 0);
            assert!((5..=50).contains(&seen[1]), "{seen:?}");
            assert!(seen[2..].iter().all(|&n| (2..=30).contains(&n)), "{seen:?}");
            // Neighbours alike about 1 time in 128, as by chance.
            let alike = (1..1600)
                .filter(|&i| {
                    PythonFrame::identity_of(word(i - 1)) == PythonFrame::identity_of(word(i))
                })
                .count();
            assert!(alike < 40, "{alike} neighbours alike");
        }
        // The same word as Python's test helpers compute it (tests/workloads/pyshortcode.py).
        assert_eq!(PythonFrame::identity_of(0), 1);
        // No word gives the unknown identity.
        assert!((0..100_000u64)
            .flat_map(|i| [i, i << 32, 0x7f00_0000_0000 + i * 16, u64::MAX - i])
            .all(|w| PythonFrame::identity_of(w) != PythonFrame::UNKNOWN_IDENTITY));
        assert_eq!(PythonFrame::identity_of(901 << 32), 73);
    }
}
