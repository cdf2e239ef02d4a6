//! V8's JavaScript frames (Node.js), recorded during the CFI walk.
//!
//! V8's generated code (interpreter trampolines, baseline, optimized code) keeps a frame
//! pointer chain and has no CFI, so the CFI walk unwinds it by frame pointer
//! (`unwind::no_cfi_frame`). For a process userspace registered here, each such frame is also
//! checked for being a JavaScript frame: the slot below the frame pointer that typed frames
//! mark with a Smi holds a heap object, and the function slot holds a JSFunction (its map's
//! instance type in the process's range). Its SharedFunctionInfo, code object and bytecode
//! offset go to this CPU's runtime stack, with the frame's index in the native stack, and
//! userspace names them from the process's memory. Every read is a checked user read of a
//! fixed size, and each frame costs at most five: a process that fakes its constants gets
//! wrong or no JavaScript frames, nothing else.

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    Counter, StackFrames, V8Frame, V8Process, MAX_STACK_DEPTH, MAX_V8_PROCESSES,
    V8_FRAME_SLOT_BYTES,
};

/// The constants of each V8 process whose JavaScript frames are recorded, by host tgid.
#[map]
static V8_PROCESSES: HashMap<u32, V8Process> = HashMap::with_max_entries(MAX_V8_PROCESSES, 0);

/// Each CPU's JavaScript frames of the walk under way ([`V8Frame::WORDS`] words each).
#[map]
static V8_FRAMES: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

const SLOT_WORDS: usize = (V8_FRAME_SLOT_BYTES / 8) as usize;

/// Each CPU's copy of the words below a frame pointer that [`record_frame`] reads.
#[map]
static V8_SLOTS: PerCpuArray<[u64; SLOT_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// The constants of process `tgid` when its JavaScript frames are recorded; starts its frame
/// list.
#[inline(always)]
pub fn start(tgid: u32, into: &mut V8Process) -> bool {
    let Some(frames) = V8_FRAMES.get_ptr_mut(0) else {
        return false;
    };
    // Emptied for every walk, a V8 process's or not: the list is this CPU's, and frames a
    // walk of Node left there are no other process's (see [`store`]).
    // SAFETY: this CPU's slot; programs do not nest on a CPU.
    unsafe { (*frames).len = 0 };
    let Some(v8) = V8_PROCESSES.get_ptr(tgid) else {
        return false;
    };
    // Copied from the map value straight into the walk's (a map value too): a copy through a
    // local put the struct on the walker's stack, whose frames together must stay within the
    // 512 bytes older kernels (6.1, 6.12) allow for a call chain with its bpf_loop callbacks.
    // SAFETY: a valid entry of the map, copied into this CPU's walk.
    unsafe { core::ptr::copy_nonoverlapping(v8, into, 1) };
    true
}

/// Records frame `index` of the native walk (instruction pointer `ip`, frame pointer `fp`)
/// when it is a JavaScript frame.
#[inline(always)]
pub fn record_frame(v8: &V8Process, index: u32, ip: u64, fp: u64) {
    let (marker, function, bytecode) = (v8.fp_marker, v8.fp_function, v8.fp_bytecode_offset);
    // Each slot lies in the words read below the frame pointer, on a word boundary.
    let fits = |below: u32| (8..=V8_FRAME_SLOT_BYTES).contains(&below) && below.is_multiple_of(8);
    if !(fits(marker) && fits(function) && fits(bytecode)) || fp < V8_FRAME_SLOT_BYTES as u64 {
        return;
    }
    // Read into this CPU's slot buffer rather than onto the stack (see [`start`]).
    let Some(slots) = V8_SLOTS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: user memory read through the checked helper into this CPU's buffer, whose size
    // is the size read.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            slots.cast(),
            (SLOT_WORDS * 8) as u32,
            (fp - V8_FRAME_SLOT_BYTES as u64) as *const core::ffi::c_void,
        )
    };
    if read != 0 {
        return;
    }
    // SAFETY: this CPU's buffer, just filled.
    let slots = unsafe { &*slots };
    let slot = |below: u32| slots[(SLOT_WORDS - (below / 8) as usize) & (SLOT_WORDS - 1)];
    // Typed frames (entry, exit, stubs, builtins' own) hold a Smi marker; JavaScript frames
    // their context, a heap object (tag 1).
    if slot(marker) & 1 == 0 {
        return;
    }
    let function = slot(function);
    if function & 3 != 1 {
        return;
    }
    let object = function - 1;
    let Some(map) = read_tagged(object.wrapping_add(v8.heap_object_map as u64)) else {
        return;
    };
    // SAFETY: user memory read through the checked helper.
    let Ok(kind) = (unsafe {
        bpf_probe_read_user((map - 1).wrapping_add(v8.map_instance_type as u64) as *const u16)
    }) else {
        return;
    };
    if kind < v8.function_type_first || kind > v8.function_type_last {
        return;
    }
    let Some(shared) = read_tagged(object.wrapping_add(v8.function_shared as u64)) else {
        return;
    };
    // The code may be absent in a function not compiled yet: 0 then.
    let code = read_tagged(object.wrapping_add(v8.function_code as u64)).unwrap_or(0);
    let Some(frames) = V8_FRAMES.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU.
    let frames = unsafe { &mut *frames };
    let at = frames.len as usize;
    if at + V8Frame::WORDS > MAX_STACK_DEPTH {
        return;
    }
    // Word by word, with no array on the stack (see [`start`]).
    frames.ips[at & (MAX_STACK_DEPTH - 1)] = V8Frame::word0(index as u16, slot(bytecode));
    frames.ips[(at + 1) & (MAX_STACK_DEPTH - 1)] = shared;
    frames.ips[(at + 2) & (MAX_STACK_DEPTH - 1)] = ip;
    frames.ips[(at + 3) & (MAX_STACK_DEPTH - 1)] = code;
    frames.len = (at + V8Frame::WORDS) as u64;
}

/// A tagged heap pointer read from `at`; `None` for a Smi or a failed read.
#[inline(always)]
fn read_tagged(at: u64) -> Option<u64> {
    // SAFETY: user memory read through the checked helper.
    let word = unsafe { bpf_probe_read_user(at as *const u64) }.ok()?;
    (word & 3 == 1).then_some(word)
}

/// Stores this CPU's JavaScript frames as a runtime stack: its id, 0 when it has none or the
/// stack map is full (counted for `run`).
#[inline(always)]
pub fn store(run: u32) -> u64 {
    let (Some(frames), Some(scratch)) = (V8_FRAMES.get_ptr_mut(0), crate::SCRATCH.get_ptr_mut(0))
    else {
        return 0;
    };
    // Taken, not read: the frames are this sample's only. Left in place, they were stored
    // again as the runtime stack of every later sample on this CPU that did not walk (a
    // Python process's, one without CFI tables), whatever its process: a copy, a hash and
    // a map lookup each, and a stack of Node's on a sample of another program.
    // SAFETY: this CPU's slots; perf_event programs do not nest on a CPU.
    let len = unsafe { core::mem::replace(&mut (*frames).len, 0) } as usize;
    if len == 0 {
        return 0;
    }
    // One copy of the whole slot (a helper call) rather than a loop the verifier would walk
    // word by word: the native stack is stored already, so the scratch slot is free.
    // SAFETY: both are this CPU's `StackFrames` slots, `size` bytes each.
    let copied = unsafe {
        bpf_probe_read_kernel(
            scratch.cast(),
            core::mem::size_of::<StackFrames>() as u32,
            frames.cast(),
        )
    };
    if copied != 0 {
        return 0;
    }
    match crate::store_frames(len.min(MAX_STACK_DEPTH), Counter::UserStackMapFull) {
        Ok(id) => id,
        Err(counter) => {
            crate::count(run, counter);
            0
        }
    }
}
