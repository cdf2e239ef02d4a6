//! The Python walk: follows the sampled thread's CPython frame chain and records each frame's
//! code object and instruction, so that userspace can name the Python functions on the stack
//! (the native stack shows only the interpreter's `_PyEval_EvalFrameDefault`).
//!
//! Userspace finds the interpreter, its version's structure offsets ([`PythonProcess`]) and
//! each thread's `PyThreadState`; the kernel reads only user memory at those offsets. A frame
//! costs three or four user reads; the loop runs under `bpf_loop` so that the verifier checks
//! one frame's code once.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_buf, generated::bpf_loop,
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    Counter, PythonEntryRule, PythonFrame, PythonInstrRule, PythonProcess, StackFrames,
    MAX_PYTHON_PROCESSES, MAX_PYTHON_THREADS, MAX_STACK_DEPTH, PYTHON_FRAME_BYTES,
    PYTHON_FRAME_OWNED_BY_CSTACK,
};

/// CPython processes and their interpreter's offsets, by host tgid.
#[map]
static PYTHON_PROCESSES: HashMap<u32, PythonProcess> =
    HashMap::with_max_entries(MAX_PYTHON_PROCESSES, 0);

/// The `PyThreadState` address of each Python thread, by host tid.
#[map]
static PYTHON_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_PYTHON_THREADS, 0);

/// This CPU's copy of the frame being read (see `read_frame`), with room past
/// [`PYTHON_FRAME_BYTES`] so that a field at any offset the mask lets through is in bounds.
#[map]
static FRAME_COPY: PerCpuArray<[u8; FRAME_COPY_BYTES]> = PerCpuArray::with_max_entries(1, 0);

/// Offsets into the copy are masked to this, so the verifier sees every read in bounds.
const FIELD_OFFSET_MASK: u32 = 127;
const FRAME_COPY_BYTES: usize = FIELD_OFFSET_MASK as usize + 1 + 8;

/// The `size` bytes at `offset` of the frame copy, little-endian.
#[inline(always)]
fn field(buf: &[u8; FRAME_COPY_BYTES], offset: u32, size: usize) -> u64 {
    let at = (offset & FIELD_OFFSET_MASK) as usize;
    let mut v = 0u64;
    let mut i = 0;
    while i < size && i < 8 {
        v |= (buf[at + i] as u64) << (8 * i);
        i += 1;
    }
    v
}

#[inline(always)]
fn field_u64(buf: &[u8; FRAME_COPY_BYTES], offset: u32) -> u64 {
    field(buf, offset, 8)
}

#[inline(always)]
fn field_u32(buf: &[u8; FRAME_COPY_BYTES], offset: u32) -> u32 {
    field(buf, offset, 4) as u32
}

#[inline(always)]
fn field_u8(buf: &[u8; FRAME_COPY_BYTES], offset: u32) -> u8 {
    field(buf, offset, 1) as u8
}

/// Loop iterations of one walk: each frame, plus one shim frame per eval call at most.
const MAX_ITERATIONS: u32 = 2 * MAX_STACK_DEPTH as u32;

/// Each CPU's walk state. In a map value rather than on the stack, as the CFI walk's
/// (`unwind::WALKS`): the verifier tracks what the stack holds (the pending frame, the
/// failure flag) and checked the loop body for each combination it met (39 times, 23k of the
/// walker program's 64k verified instructions), while every map value read is to it the same
/// unknown number.
#[map]
static PYTHON_WALKS: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// The walk's state, shared with the `bpf_loop` callback.
#[repr(C)]
struct Walk {
    layout: PythonProcess,
    /// The next frame to read; 0 at the end of the chain.
    frame: u64,
    /// The last frame read, not yet written (0: none): a shim frame read after it may still
    /// mark it as an eval call's first.
    pending: u64,
    /// Non-zero when a read failed before the end of the chain.
    failed: u64,
}

/// Whether process `tgid` (host tgid) is a CPython the kernel walks.
#[inline(always)]
pub fn is_python(tgid: u32) -> bool {
    // SAFETY: only tested for presence.
    unsafe { PYTHON_PROCESSES.get(tgid) }.is_some()
}

/// Walks the current thread's Python frames and stores them; returns the stack's id, or 0 when
/// there is none (not a walked CPython, no Python code running, a failed read or store, each
/// counted for `run`).
///
/// A global function, which the verifier checks once on its own: inlined, its branches would
/// multiply with every state of the caller (the CFI walk's outcomes) and verification took
/// seconds instead of milliseconds.
#[no_mangle]
#[inline(never)]
pub extern "C" fn bpfprof_python_stack(run: u32) -> u64 {
    match walk_python_stack(run, &crate::SCRATCH) {
        Some(len) if len > 0 => match crate::store_frames(len, Counter::UserStackMapFull) {
            Ok(id) => id,
            Err(counter) => {
                crate::count(run, counter);
                0
            }
        },
        _ => 0,
    }
}

/// Walks the current thread's Python frames into `scratch` and returns how many it found:
/// `None` when the process is not a walked CPython, `Some(0)` when the thread runs no Python
/// code (or is unknown, which is counted for `run`).
#[inline(always)]
fn walk_python_stack(run: u32, scratch: &PerCpuArray<StackFrames>) -> Option<usize> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // SAFETY: the value is copied out at once.
    let layout = *unsafe { PYTHON_PROCESSES.get(tgid) }?;
    // SAFETY: as above.
    let Some(tstate) = (unsafe { PYTHON_THREADS.get(tid) }).copied() else {
        // A thread userspace has not listed yet, or one that is not Python's.
        crate::count(run, Counter::PythonStackMissing);
        return Some(0);
    };
    let Some(frame) = current_frame(&layout, tstate) else {
        crate::count(run, Counter::PythonStackMissing);
        return Some(0);
    };
    let walk = PYTHON_WALKS.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU.
    let walk = unsafe { &mut *walk };
    *walk = Walk {
        layout,
        frame,
        pending: 0,
        failed: 0,
    };
    let frames = scratch.get_ptr_mut(0)?;
    // The count of frames written lives in the map value, not in `walk`: the verifier does not
    // track map contents, so every iteration of the loop looks alike to it and it checks the
    // loop body a few times instead of once per possible count.
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on a CPU.
    unsafe { (*frames).len = 0 };
    if frame != 0 {
        // bpf_loop's context must point into the stack: a slot holding the walk's address.
        let mut slot: *mut Walk = walk;
        // SAFETY: `step` has the callback signature bpf_loop expects and `slot` outlives the
        // call.
        unsafe {
            bpf_loop(
                MAX_ITERATIONS,
                step as *mut _,
                (&mut slot as *mut *mut Walk).cast(),
                0,
            )
        };
    }
    // SAFETY: as above.
    let mut len = (unsafe { (*frames).len } as usize).min(MAX_STACK_DEPTH);
    if len > 0 && layout.gil_holder != 0 && len < MAX_STACK_DEPTH {
        // Whether this thread holds the GIL: it is locked and this thread took it last.
        // SAFETY: user memory read through the checked helper.
        let state = unsafe {
            (
                bpf_probe_read_user(layout.gil_locked as *const i32),
                bpf_probe_read_user(layout.gil_holder as *const u64),
            )
        };
        if let (Ok(locked), Ok(holder)) = state {
            let marker = if locked != 0 && holder == tstate {
                PythonFrame::GIL_HELD
            } else {
                PythonFrame::GIL_NOT_HELD
            };
            // SAFETY: as above; `len` is below the array's length.
            unsafe { (*frames).ips[len] = marker };
            len += 1;
            // SAFETY: as above.
            unsafe { (*frames).len = len as u64 };
        }
    }
    if len > 0 {
        crate::count(run, Counter::PythonStacks);
    } else if walk.failed != 0 {
        crate::count(run, Counter::PythonStackMissing);
    }
    Some(len)
}

/// The thread's innermost frame (0 when it runs no Python code), or `None` on a bad read.
#[inline(always)]
fn current_frame(layout: &PythonProcess, tstate: u64) -> Option<u64> {
    // SAFETY: user memory read through the checked helper.
    let mut frame: u64 =
        unsafe { bpf_probe_read_user((tstate + layout.tstate_frame as u64) as *const u64) }.ok()?;
    if layout.cframe_current_frame != u32::MAX && frame != 0 {
        // 3.11 and 3.12: the thread state points to a `_PyCFrame`, which points to the frame.
        // SAFETY: as above.
        frame = unsafe {
            bpf_probe_read_user((frame + layout.cframe_current_frame as u64) as *const u64)
        }
        .ok()?;
    }
    Some(frame)
}

/// Reads one frame and moves to its caller, writing the frame read before. Returns 1 to stop.
#[inline(never)]
extern "C" fn step(_index: u64, walk: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the stack slot `walk_python_stack` gave it, which holds
    // this CPU's walk.
    let walk = unsafe { &mut **(walk as *mut *mut Walk) };
    let Some(frames) = crate::SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's scratch slot.
    let frames = unsafe { &mut *frames };
    match read_frame(walk) {
        Frame::Code(packed) => {
            if !flush(walk, frames) {
                return 1;
            }
            walk.pending = packed;
            0
        }
        Frame::Shim => {
            // 3.12+: a shim frame marks where one `_PyEval_EvalFrameDefault` call began; the
            // frame read just before it was that call's first.
            if walk.pending != 0 {
                walk.pending = PythonFrame::with_eval_entry(walk.pending);
            }
            0
        }
        Frame::Skip => 0,
        Frame::End => {
            flush(walk, frames);
            1
        }
    }
}

/// Writes the pending frame, if any; false when the stack is full.
#[inline(always)]
fn flush(walk: &mut Walk, frames: &mut StackFrames) -> bool {
    if walk.pending == 0 {
        return true;
    }
    let i = frames.len;
    if i >= MAX_STACK_DEPTH as u64 {
        return false;
    }
    frames.ips[i as usize] = walk.pending;
    frames.len = i + 1;
    walk.pending = 0;
    true
}

/// What one step of the chain found.
enum Frame {
    /// A Python frame, packed.
    Code(u64),
    /// A shim frame that only marks the start of an eval call.
    Shim,
    /// A frame with nothing to record.
    Skip,
    /// The end of the chain, or a read that failed (`walk.failed` says which).
    End,
}

/// Reads `walk.frame` and moves `walk.frame` to its caller.
#[inline(always)]
fn read_frame(walk: &mut Walk) -> Frame {
    let layout = &walk.layout;
    let frame = walk.frame;
    if frame == 0 {
        return Frame::End;
    }
    // One user read per frame instead of one per field: the fields are then taken from this
    // CPU's copy. User reads dominate the walk's cost (about 0.1 µs each).
    let Some(buf) = FRAME_COPY.get_ptr_mut(0) else {
        walk.failed = 1;
        return Frame::End;
    };
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU.
    let buf = unsafe { &mut *buf };
    // SAFETY: user memory read through the checked helper into the slot's first bytes.
    if unsafe { bpf_probe_read_user_buf(frame as *const u8, &mut buf[..PYTHON_FRAME_BYTES]) }
        .is_err()
    {
        walk.failed = 1;
        return Frame::End;
    }
    let previous = field_u64(buf, layout.frame_previous);
    let entry_byte = if layout.entry_rule == PythonEntryRule::EveryFrame as u32 {
        0u8
    } else {
        field_u8(buf, layout.frame_entry)
    };
    let shim = layout.entry_rule == PythonEntryRule::ShimFrame as u32
        && entry_byte == PYTHON_FRAME_OWNED_BY_CSTACK;
    let code = if shim {
        0
    } else {
        field_u64(buf, layout.frame_code)
    };
    let instruction = if shim {
        0
    } else if layout.instr_rule == PythonInstrRule::LastiIndex as u32 {
        let lasti = field_u32(buf, layout.frame_instr) as i32;
        if lasti > 0 {
            lasti as u32
        } else {
            0
        }
    } else {
        let ptr = field_u64(buf, layout.frame_instr);
        let first = code.wrapping_add(layout.code_instructions as u64);
        if ptr >= first {
            // Code units are 2 bytes.
            ((ptr - first) / 2).min(PythonFrame::MAX_INSTRUCTION as u64) as u32
        } else {
            0
        }
    };
    let entry = layout.entry_rule == PythonEntryRule::EveryFrame as u32
        || (layout.entry_rule == PythonEntryRule::EntryFlag as u32 && entry_byte != 0);
    walk.frame = previous;
    if shim {
        Frame::Shim
    } else if code == 0 {
        // A frame without code cannot be named; its callers still can.
        Frame::Skip
    } else {
        Frame::Code(PythonFrame::pack(code, instruction, entry))
    }
}
