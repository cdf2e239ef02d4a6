//! The Python walk: follows the sampled thread's CPython frame chain and records each frame's
//! code object and instruction, so that userspace can name the Python functions on the stack
//! (the native stack shows only the interpreter's `_PyEval_EvalFrameDefault`).
//!
//! Userspace finds the interpreter, its version's structure offsets ([`PythonProcess`]) and
//! each thread's `PyThreadState`; the kernel reads only user memory at those offsets. Frames
//! are taken from a copy of the memory that ends with the frame (up to
//! [`PYTHON_FRAME_WINDOW_BYTES`]): from 3.11 on a thread's frames lie one after another on its
//! data stack, callers below callees, so one user read serves several frames (a read costs
//! about 50 ns, most of a frame's cost when each frame had its own). The loop runs under
//! `bpf_loop` so that the verifier checks one frame's code once.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{self, bpf_loop},
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    Counter, PythonEntryRule, PythonFrame, PythonInstrRule, PythonProcess, PythonThread,
    StackFrames, MAX_PYTHON_PROCESSES, MAX_PYTHON_THREADS, MAX_STACK_DEPTH, PYTHON_FRAME_BYTES,
    PYTHON_FRAME_OWNED_BY_CSTACK, PYTHON_FRAME_WINDOW_BYTES, PYTHON_STACKREF_TAG_BITS,
    PYTHON_STACKS_STORED_INDEX, STACKS_STORED_INDEX,
};

/// CPython processes and their interpreter's offsets, by host tgid.
#[map]
static PYTHON_PROCESSES: HashMap<u32, PythonProcess> =
    HashMap::with_max_entries(MAX_PYTHON_PROCESSES, 0);

/// The thread state and process of each Python thread, by host tid.
#[map]
static PYTHON_THREADS: HashMap<u32, PythonThread> =
    HashMap::with_max_entries(MAX_PYTHON_THREADS, 0);

/// Words of [`Walk::window`].
const WINDOW_WORDS: usize = PYTHON_FRAME_WINDOW_BYTES / 8;
const _: () = assert!(WINDOW_WORDS.is_power_of_two());
/// A frame's bytes: every field read lies within them.
const FRAME_BYTES: u64 = PYTHON_FRAME_BYTES as u64;
/// The smallest page x86-64 maps: memory from a mapped address down to its page's start is
/// mapped too, so a window read never starts below the frame's page.
const PAGE_BYTES: u64 = 4096;

// The GIL marker's index is masked with `MAX_STACK_DEPTH - 1`.
const _: () = assert!(MAX_STACK_DEPTH.is_power_of_two());

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
    /// User address of `window[0]`.
    window_at: u64,
    /// Bytes of `window` that hold user memory (0: none).
    window_len: u64,
    /// The code object whose identity bits were read last (0: none), and those bits: the
    /// frames of a recursion read them once.
    identity_code: u64,
    identity: u64,
    /// The code object and thread-local bytecode index (free-threaded 3.14+) whose copy's
    /// address was read last (`tlbc_code` 0: none), and that address: a thread's frames of
    /// one function (a recursion) read it once.
    tlbc_code: u64,
    tlbc_index: u64,
    tlbc_bytecode: u64,
    /// A copy of the memory that ends with the last frame read anew (see `window_offset`).
    window: [u64; WINDOW_WORDS],
}

/// What each `bpf_loop` iteration of the walk gets: its state and the stack it writes, found
/// once per walk rather than once per frame.
#[repr(C)]
struct StepContext {
    walk: *mut Walk,
    frames: *mut StackFrames,
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
        Some(len) if len > 0 => {
            // This CPU's count of stacks stored new, before and after: per CPU, and programs
            // do not nest on one, so a change is this stack's.
            let before = crate::counter_value(STACKS_STORED_INDEX);
            let stored = crate::store_frames(len, Counter::UserStackMapFull);
            if stored.is_ok() && crate::counter_value(STACKS_STORED_INDEX) != before {
                crate::increment(PYTHON_STACKS_STORED_INDEX);
            }
            match stored {
                Ok(id) => id,
                Err(counter) => {
                    crate::count(run, counter);
                    0
                }
            }
        }
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
    let Some(thread) = (unsafe { PYTHON_THREADS.get(tid) }).copied() else {
        // A thread userspace has not listed yet, or one that is not Python's.
        crate::count(run, Counter::PythonStackMissing);
        return Some(0);
    };
    if thread.tgid != tgid {
        // Another process's entry for a reused thread id: unknown here, so that userspace
        // lists this process's threads (see `PythonThread`).
        crate::count(run, Counter::PythonStackMissing);
        return Some(0);
    }
    let tstate = thread.tstate;
    let Some(frame) = current_frame(&layout, tstate) else {
        crate::count(run, Counter::PythonStackMissing);
        return Some(0);
    };
    let walk = PYTHON_WALKS.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU.
    let walk = unsafe { &mut *walk };
    // Field by field: the window's old bytes are not read again (`window_len` is 0), so
    // clearing its 1 KiB would only cost time.
    walk.layout = layout;
    walk.frame = frame;
    walk.pending = 0;
    walk.failed = 0;
    walk.window_at = 0;
    walk.window_len = 0;
    walk.identity_code = 0;
    walk.tlbc_code = 0;
    let frames = scratch.get_ptr_mut(0)?;
    // The count of frames written lives in the map value, not in `walk`: the verifier does not
    // track map contents, so every iteration of the loop looks alike to it and it checks the
    // loop body a few times instead of once per possible count.
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on a CPU.
    unsafe { (*frames).len = 0 };
    if frame != 0 {
        // bpf_loop's context must point into the stack: a struct holding both addresses.
        let mut context = StepContext { walk, frames };
        // SAFETY: `step` has the callback signature bpf_loop expects and `context` outlives
        // the call.
        unsafe {
            bpf_loop(
                MAX_ITERATIONS,
                step as *mut _,
                (&mut context as *mut StepContext).cast(),
                0,
            )
        };
    }
    // SAFETY: as above.
    let mut len = (unsafe { (*frames).len } as usize).min(MAX_STACK_DEPTH);
    if len > 0 && (layout.gil_holder != 0 || layout.free_threaded != 0) && len < MAX_STACK_DEPTH {
        // Whether this thread holds the GIL: it is locked and this thread took it last; a
        // free-threaded build has none to hold.
        let marker = if layout.free_threaded != 0 {
            Some(PythonFrame::NO_GIL)
        } else {
            gil_state(&layout).map(|(locked, holder)| {
                if locked != 0 && holder == tstate {
                    PythonFrame::GIL_HELD
                } else {
                    PythonFrame::GIL_NOT_HELD
                }
            })
        };
        if let Some(marker) = marker {
            // Masked, though `len` is below the array's length: LLVM checked the unclamped
            // count and indexed with the clamped one, and the verifiers of 6.1 and 6.12 did not
            // relate the two ("invalid access to map value ... off=4104"). `black_box` keeps
            // LLVM from dropping the mask it knows to be a no-op.
            let at = core::hint::black_box(len) & (MAX_STACK_DEPTH - 1);
            // SAFETY: as above.
            unsafe { (*frames).ips[at] = marker };
            len += 1;
            // SAFETY: as above.
            unsafe { (*frames).len = len as u64 };
        }
    }
    if len > 0 && layout.tstate_running_task != 0 && len + 2 <= MAX_STACK_DEPTH {
        if let Some((task, identity)) = running_task(&layout, tstate) {
            // Masked as the GIL entry's index is, for the verifiers of 6.1 and 6.12.
            let at = core::hint::black_box(len) & (MAX_STACK_DEPTH - 1);
            // SAFETY: as above.
            unsafe { (*frames).ips[at] = PythonFrame::task_entry(identity) };
            let at = core::hint::black_box(len + 1) & (MAX_STACK_DEPTH - 1);
            // SAFETY: as above.
            unsafe { (*frames).ips[at] = task };
            len += 2;
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

/// The asyncio task the thread runs (CPython 3.14+'s `asyncio_running_task`) and its
/// coroutine's identity bits, or `None` when it runs none or a read fails: two reads, the
/// task pointer and the task's coroutine pointer (unknown identity when that one fails).
#[inline(always)]
fn running_task(layout: &PythonProcess, tstate: u64) -> Option<(u64, u8)> {
    let at = tstate.wrapping_add(layout.tstate_running_task as u64);
    // SAFETY: user memory read through the checked helper.
    let task = unsafe { bpf_probe_read_user(at as *const u64) }.ok()?;
    if task == 0 {
        return None;
    }
    let at = task.wrapping_add(layout.task_coro as u64);
    // SAFETY: as above.
    let identity = match unsafe { bpf_probe_read_user(at as *const u64) } {
        Ok(coro) => PythonFrame::identity_of(coro),
        Err(_) => PythonFrame::UNKNOWN_IDENTITY,
    };
    Some((task, identity))
}

/// The GIL's `locked` flag and `last_holder`, or `None` on a bad read: one read where `locked`
/// follows `last_holder` (every CPython's `_gil_runtime_state`), else one each.
#[inline(always)]
fn gil_state(layout: &PythonProcess) -> Option<(i32, u64)> {
    if layout.gil_locked == layout.gil_holder.wrapping_add(8) {
        // SAFETY: user memory read through the checked helper; the 4 bytes after `locked`
        // are its struct's padding.
        let pair = unsafe { bpf_probe_read_user(layout.gil_holder as *const [u64; 2]) }.ok()?;
        return Some((pair[1] as u32 as i32, pair[0]));
    }
    // SAFETY: as above.
    let locked = unsafe { bpf_probe_read_user(layout.gil_locked as *const i32) }.ok()?;
    // SAFETY: as above.
    let holder = unsafe { bpf_probe_read_user(layout.gil_holder as *const u64) }.ok()?;
    Some((locked, holder))
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
extern "C" fn step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the stack slot `walk_python_stack` gave it, which holds
    // this CPU's walk and scratch slot.
    let context = unsafe { &*(context as *const StepContext) };
    // SAFETY: as above.
    let (walk, frames) = unsafe { (&mut *context.walk, &mut *context.frames) };
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
    let frame = walk.frame;
    if frame == 0 {
        return Frame::End;
    }
    let Some(at) = window_offset(walk, frame) else {
        walk.failed = 1;
        return Frame::End;
    };
    let layout = &walk.layout;
    let previous = word(walk, at, layout.frame_previous);
    let entry_byte = if layout.entry_rule == PythonEntryRule::EveryFrame as u32 {
        0u8
    } else {
        word(walk, at, layout.frame_entry) as u8
    };
    let shim = layout.entry_rule == PythonEntryRule::ShimFrame as u32
        && entry_byte == PYTHON_FRAME_OWNED_BY_CSTACK;
    // 3.14+'s `f_executable` is a `_PyStackRef`: a pointer with tag bits.
    let code = if shim {
        0
    } else {
        word(walk, at, layout.frame_code) & !PYTHON_STACKREF_TAG_BITS
    };
    let entry = layout.entry_rule == PythonEntryRule::EveryFrame as u32
        || (layout.entry_rule == PythonEntryRule::EntryFlag as u32 && entry_byte != 0);
    let instruction = if shim {
        0
    } else if layout.instr_rule == PythonInstrRule::LastiIndex as u32 {
        let lasti = word(walk, at, layout.frame_instr) as u32 as i32;
        if lasti > 0 {
            lasti as u32
        } else {
            0
        }
    } else {
        let ptr = word(walk, at, layout.frame_instr);
        // Free-threaded 3.14+: a frame whose `tlbc_index` is not 0 runs its thread's own
        // copy of the bytecode, which `instr_ptr` points into.
        let tlbc_index = if layout.frame_tlbc_index != 0 {
            word(walk, at, layout.frame_tlbc_index) as u32 as i32
        } else {
            0
        };
        let first = if tlbc_index > 0 {
            thread_bytecode(walk, code, tlbc_index as u64)
        } else {
            code.wrapping_add(walk.layout.code_instructions as u64)
        };
        if ptr >= first {
            // Code units are 2 bytes.
            ((ptr - first) / 2).min(PythonFrame::MAX_INSTRUCTION as u64) as u32
        } else {
            0
        }
    };
    walk.frame = previous;
    if shim {
        Frame::Shim
    } else if code == 0 {
        // A frame without code cannot be named; its callers still can.
        Frame::Skip
    } else {
        Frame::Code(PythonFrame::pack(
            code,
            instruction,
            identity(walk, code),
            entry,
        ))
    }
}

/// Where the thread-local copy `index` of the bytecode of the code object at `code` starts
/// (`co_tlbc->entries[index]`), read unless the frame before had the same code and index; 0
/// when a read fails (the instruction is then 0: the function's first line, not a wrong one).
#[inline(always)]
fn thread_bytecode(walk: &mut Walk, code: u64, index: u64) -> u64 {
    if code != walk.tlbc_code || index != walk.tlbc_index {
        let at = code.wrapping_add(walk.layout.code_tlbc as u64);
        // SAFETY: user memory read through the checked helper.
        let bytecode = unsafe { bpf_probe_read_user(at as *const u64) }
            .ok()
            .filter(|&array| array != 0)
            .and_then(|array| {
                // `_PyCodeArray`: its size, then the entries.
                let entry = array.wrapping_add(8).wrapping_add(index.wrapping_mul(8));
                // SAFETY: as above.
                unsafe { bpf_probe_read_user(entry as *const u64) }.ok()
            });
        walk.tlbc_code = code;
        walk.tlbc_index = index;
        walk.tlbc_bytecode = bytecode.unwrap_or(0);
    }
    walk.tlbc_bytecode
}

/// The identity bits of the code object at `code` ([`PythonFrame::identity_of`] its
/// `code_identity` word), read unless the frame before had the same code;
/// [`PythonFrame::UNKNOWN_IDENTITY`] when a read fails or the word is a name's hash not
/// computed yet (it will change: a frame recorded with it would not match its own object
/// once something hashed the name, as Dynamo's fresh code objects' names were).
#[inline(always)]
fn identity(walk: &mut Walk, code: u64) -> u8 {
    if code != walk.identity_code {
        let at = code.wrapping_add(walk.layout.code_identity as u64);
        // SAFETY: user memory read through the checked helper.
        let mut word = unsafe { bpf_probe_read_user(at as *const u64) }.ok();
        if walk.layout.code_identity_deref != 0 {
            word = match word {
                Some(name) if name != 0 => {
                    let at = name.wrapping_add(walk.layout.code_identity_deref as u64);
                    // SAFETY: as above.
                    unsafe { bpf_probe_read_user(at as *const u64) }
                        .ok()
                        .filter(|&hash| hash != PythonFrame::HASH_NOT_COMPUTED)
                }
                _ => None,
            };
        }
        walk.identity_code = code;
        walk.identity = word.map_or(PythonFrame::UNKNOWN_IDENTITY, PythonFrame::identity_of) as u64;
    }
    walk.identity as u8
}

/// Where the frame at user address `frame` starts in `walk.window`, read anew unless the
/// window holds all its [`FRAME_BYTES`]; `None` for a frame that is not 8-aligned (CPython's
/// all are) or cannot be read.
///
/// A new window ends with the frame's bytes and starts up to `layout.frame_window` bytes
/// below, but not below the frame's page: that memory is mapped, since the frame is, where
/// the page below may not be (a failed read costs a fault and gives nothing).
#[inline(always)]
fn window_offset(walk: &mut Walk, frame: u64) -> Option<u64> {
    if frame & 7 != 0 {
        return None;
    }
    let offset = frame.wrapping_sub(walk.window_at);
    if walk.window_len >= FRAME_BYTES && offset <= walk.window_len - FRAME_BYTES {
        return Some(offset);
    }
    let end = frame.checked_add(FRAME_BYTES)?;
    let bytes = (walk.layout.frame_window as u64 & !7).clamp(FRAME_BYTES, WINDOW_WORDS as u64 * 8);
    let start = end.saturating_sub(bytes).max(frame & !(PAGE_BYTES - 1));
    let len = end - start;
    // Always true (`start` is at least `end - bytes`); said again for the verifier.
    if len > (WINDOW_WORDS * 8) as u64 {
        return None;
    }
    walk.window_len = 0;
    // SAFETY: user memory read through the checked helper into the window, `len` bytes of
    // its `WINDOW_WORDS * 8`.
    let rc = unsafe {
        generated::bpf_probe_read_user(
            walk.window.as_mut_ptr().cast(),
            len as u32,
            start as *const core::ffi::c_void,
        )
    };
    if rc != 0 {
        return None;
    }
    walk.window_at = start;
    walk.window_len = len;
    Some(frame - start)
}

/// The field at `offset` of the frame at byte `at` of the window, in the low bits of the
/// 8-byte word that holds it: fields are aligned to their size (userspace checks), and so is
/// every frame in the window (an 8-aligned frame, `FRAME_BYTES` and the window's size are
/// multiples of 8), so no field spans two words.
#[inline(always)]
fn word(walk: &Walk, at: u64, offset: u32) -> u64 {
    let byte = at.wrapping_add(offset as u64);
    walk.window[(byte / 8) as usize & (WINDOW_WORDS - 1)] >> ((byte & 7) * 8)
}
