//! The CFI walk: unwinds a target's user stack from the sample's registers with the tables
//! userspace built from each object's `.eh_frame`, so that code without frame pointers still
//! yields full stacks.
//!
//! Each frame costs a bisection over the object's rows (array lookups the verifier inlines),
//! and when it leaves the previous frame's object a hash lookup (the process's mappings) and a
//! bisection over those mappings. Its return address and saved rbp come from a window of stack
//! copied 512 bytes at a time: the user read, a helper call, was half a frame's cost.
//! The frame loop runs under `bpf_loop`, so the verifier checks one frame's code once instead
//! of 127 unrolled copies: that is what lets the walk reach the full depth.
//!
//! A frame in code with no CFI (JIT code in anonymous memory, hand-written assembly, an
//! object whose table is not loaded yet) is unwound by its frame pointer when that leads to
//! code; else the walk scans the stack above it, as Breakpad does, for the first word that
//! returns right after a call instruction into code with CFI, and goes on from there. One
//! `bpf_loop` iteration scans one word, so a scan costs no verifier work per word either.
//! Frames with CFI are never guessed.

use aya_ebpf::{
    bindings::{bpf_perf_event_data, pt_regs, BPF_F_MMAPABLE},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_loop, bpf_task_pt_regs},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    follows_call, CfaRule, Counter, HotspotProcess, ProcessMappings, UnwindMapping, UnwindRow,
    V8Process, HOTSPOT_INTERPRETED, MAX_HOTSPOT_PROCESSES, MAX_STACK_DEPTH, MAX_UNWIND_MAPPINGS,
    MAX_UNWIND_PROCESSES, MAX_UNWIND_ROWS, RETURN_ADDRESS_OFFSET, SIGNAL_FRAME_RBP,
    SIGNAL_FRAME_RIP, SIGNAL_FRAME_RSP, STACK_SCANS, STACK_SCAN_WORDS, UNWIND_MAPPING_SEARCH_STEPS,
    UNWIND_TABLE_SEARCH_STEPS,
};

mod hotspot;

pub use hotspot::take_hotspot_stack;
use hotspot::{hotspot_interpreter_frame, store_hotspot_frames, HOTSPOT_PROCESSES};

/// Every loaded table's rows, end to end; a table is a range of this array. Mmapable, so
/// userspace writes a table with one copy instead of a syscall per row.
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(MAX_UNWIND_ROWS, BPF_F_MMAPABLE);

/// The executable mappings of each process that is unwound by CFI, by host tgid. A process
/// absent here is unwound by the kernel's frame-pointer walk.
#[map]
static UNWIND_PROCESSES: HashMap<u32, ProcessMappings> =
    HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

/// Each CPU's walk state. In a map value rather than on the stack: the verifier tracks the
/// stack's constants (a count of scans left, flags, frame counts) and checks the frame loop's
/// body once for every combination of them it meets, while every map value read is to it
/// the same unknown number, so it checks the body a few times in all.
#[map]
static WALKS: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

// `find_mapping` masks its indexes with `MAX_UNWIND_MAPPINGS - 1`.
const _: () = assert!(MAX_UNWIND_MAPPINGS.is_power_of_two());

/// How a walk ended.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum WalkEnd {
    /// Still walking, or stopped at the depth limit.
    Running = 0,
    /// Reached the outermost frame.
    Complete = 1,
    /// Stopped early: a bad read, a loop, a pc outside the known executable mappings.
    Early = 2,
}

/// The registers of the frame being unwound, shared with the `bpf_loop` callback.
#[repr(C)]
struct Walk {
    ip: u64,
    sp: u64,
    bp: u64,
    tgid: u32,
    end: u32,
    len: u32,
    fp_frames: u32,
    /// Non-zero when `ip` is the exact instruction of its frame rather than a return address:
    /// the interrupted frame below a signal handler.
    exact_ip: u32,
    /// Scans the walk may still make.
    scans_left: u32,
    /// Frames found by scanning.
    scanned: u32,
    /// Non-zero once the current scan found the frame's return address.
    scan_found: u32,
    /// Non-zero when the process's V8 JavaScript frames are recorded (with `v8`'s constants).
    v8_on: u32,
    v8: V8Process,
    /// The mapping of the previous frame: most callers sit in the same object as their
    /// callee, and this skips the process lookup and the mapping bisection for them.
    mapping: UnwindMapping,
    /// User address of `window[0]`.
    window_at: u64,
    /// Bytes of `window` that hold user memory (0: none).
    window_len: u64,
    /// A copy of the stack from `window_at`, read at once: the next frames' return addresses
    /// and saved registers lie just above the current one, and one read of the window costs
    /// about what one read of a word does (a helper call each).
    window: [u64; STACK_WINDOW_WORDS],
    /// The process's JVM code cache (zero when it runs none): frames in it are recorded in
    /// `java` too, for userspace to name.
    hotspot: HotspotProcess,
    /// Entries of `java` written.
    java_len: u32,
    /// The stack id of the last walk's JVM frames (0: none), taken by [`take_hotspot_stack`].
    java_id: u64,
    /// The walk's code cache frames, innermost first: each pc, or for an interpreter frame
    /// its `Method*` tagged [`HOTSPOT_INTERPRETED`].
    java: [u64; MAX_STACK_DEPTH],
}

// The JVM frames' indexes are masked with `MAX_STACK_DEPTH - 1`.
const _: () = assert!(MAX_STACK_DEPTH.is_power_of_two());

/// Words of stack [`Walk::window`] copies at once: 512 bytes, 32 frames of a small
/// recursive function. A power of two, since indexes into it are masked.
const STACK_WINDOW_WORDS: usize = 64;
const _: () = assert!(STACK_WINDOW_WORDS.is_power_of_two());

/// Whether userspace loaded CFI tables for process `tgid` (host tgid).
#[inline(always)]
pub fn is_unwound(tgid: u32) -> bool {
    // SAFETY: only tested for presence.
    unsafe { UNWIND_PROCESSES.get(tgid) }.is_some()
}

/// What [`cfi_stack`] returns for a process without CFI tables (or a walk that found
/// no frame): the caller then takes the kernel's frame-pointer walk.
pub const NOT_UNWOUND: u64 = u64::MAX;

/// Walks the current task's user stack from registers `ip`, `sp`, `bp` with the CFI tables and
/// stores it: returns its stack id, [`NOT_UNWOUND`], or 0 when the stack map was full (counted
/// for `run`, as are the walk's statistics).
///
/// Inlined: as a global function verified on its own (like the Python walk) it took the
/// verifier twice as long.
#[inline(always)]
pub fn cfi_stack(ip: u64, sp: u64, bp: u64, run: u32) -> u64 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // A process without tables has no mappings to find: one lookup of the process, not two.
    // The mapping cache starts as the innermost frame's mapping, read from the map, never as
    // constants: Linux 6.1's verifier checks a bpf_loop callback once, from the state at the
    // call, and with a zeroed cache there the walk lost every frame after the first that hit
    // it (`nofp` in the 6.1 VM: `parent_a;burn` and no further, while 6.12 reached `main`).
    let Some(mapping) = find_mapping(tgid, ip) else {
        return NOT_UNWOUND;
    };
    let Some(walk) = WALKS.get_ptr_mut(0) else {
        return NOT_UNWOUND;
    };
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU.
    let walk = unsafe { &mut *walk };
    // Field by field: the window's old words are never read (`window_len` is 0), and
    // clearing its 512 bytes on every sample would cost 64 stores.
    walk.ip = ip;
    walk.sp = sp;
    walk.bp = bp;
    walk.tgid = tgid;
    walk.end = WalkEnd::Running as u32;
    walk.len = 0;
    walk.fp_frames = 0;
    walk.exact_ip = 0;
    walk.scans_left = STACK_SCANS;
    walk.scanned = 0;
    walk.scan_found = 0;
    walk.mapping = mapping;
    walk.window_at = 0;
    walk.window_len = 0;
    match HOTSPOT_PROCESSES.get_ptr(tgid) {
        // Straight from the map value into the walk's, not through the stack (see
        // `crate::v8::start`).
        // SAFETY: a valid entry of the map, copied into this CPU's walk.
        Some(jvm) => unsafe { core::ptr::copy_nonoverlapping(jvm, &mut walk.hotspot, 1) },
        None => {
            walk.hotspot.code_start = 0;
            walk.hotspot.code_end = 0;
        }
    }
    walk.java_len = 0;
    walk.java_id = 0;
    walk.v8_on = u32::from(crate::v8::start(tgid, &mut walk.v8));
    // bpf_loop's context must point into the stack: a slot holding the walk's address. That
    // the address escapes also tells the compiler the callbacks change the walk.
    let mut slot: *mut Walk = walk;
    // SAFETY: `step` has the callback signature bpf_loop expects and `slot` outlives the call.
    unsafe {
        bpf_loop(
            MAX_STACK_DEPTH as u32,
            step as *mut _,
            (&mut slot as *mut *mut Walk).cast(),
            0,
        )
    };
    let len = (walk.len as usize).min(MAX_STACK_DEPTH);
    let Some(frames) = crate::SCRATCH.get_ptr_mut(0) else {
        return NOT_UNWOUND;
    };
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on a CPU.
    let frames = unsafe { &mut *frames };
    // Entries past `len` keep whatever an earlier stack left: the hash and userspace read
    // only the first `len` (zeroing them costs a 1 KiB store loop the verifier cannot bound).
    frames.len = len as u64;
    crate::count(run, Counter::CfiStacks);
    if walk.end == WalkEnd::Early as u32 {
        crate::count(run, Counter::StackEndedEarly);
    }
    add_count(run, Counter::FramePointerFrames, walk.fp_frames);
    add_count(run, Counter::ScannedFrames, walk.scanned);
    if walk.fp_frames != 0 || walk.scanned != 0 {
        crate::count(run, Counter::UntabledStacks);
    }
    if len == 0 {
        return NOT_UNWOUND;
    }
    let id = match crate::store_frames(len, Counter::UserStackMapFull) {
        Ok(id) => id,
        Err(counter) => {
            crate::count(run, counter);
            0
        }
    };
    if walk.java_len > 0 {
        walk.java_id = store_hotspot_frames(walk, frames, run);
    }
    id
}

/// Adds `n` to `run`'s `counter`.
#[inline(always)]
fn add_count(run: u32, counter: Counter, n: u32) {
    if n > 0 && run < profiler_common::MAX_RUNS {
        if let Some(value) = crate::COUNTERS.get_ptr_mut(counter.index(run)) {
            // SAFETY: per-CPU slot, and perf_event programs do not nest on one CPU.
            unsafe { *value += n as u64 };
        }
    }
}

/// The user-mode ip, sp and bp of the sampled task: the sample's registers when it was taken
/// in user mode, else those saved at the top of the task's kernel stack.
#[inline(always)]
pub fn user_registers(ctx: &PerfEventContext) -> Option<(u64, u64, u64)> {
    if in_user_mode(ctx) {
        let regs = sample_registers(ctx);
        return Some((regs.rip, regs.rsp, regs.rbp));
    }
    task_user_registers()
}

/// The registers the sample interrupted.
#[inline(always)]
fn sample_registers(ctx: &PerfEventContext) -> &pt_regs {
    // SAFETY: a perf_event program's context is a bpf_perf_event_data.
    unsafe { &(*(ctx.as_ptr() as *const bpf_perf_event_data)).regs }
}

/// Whether the sample interrupted user code (its code segment's privilege level is 3).
#[inline(always)]
pub fn in_user_mode(ctx: &PerfEventContext) -> bool {
    sample_registers(ctx).cs & 3 == 3
}

/// The current task's user registers as it last entered the kernel (`task_pt_regs`): where
/// its user code is while the task runs kernel code, or sleeps in it.
#[inline(always)]
pub fn task_user_registers() -> Option<(u64, u64, u64)> {
    // SAFETY: the helper returns the current task; bpf_task_pt_regs its user registers.
    let user = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    if user.is_null() {
        return None;
    }
    // SAFETY: kernel memory read through the checked helper.
    let user: pt_regs = unsafe { bpf_probe_read_kernel(user) }.ok()?;
    if user.rip == 0 {
        // A kernel thread, or a task without user state.
        return None;
    }
    Some((user.rip, user.rsp, user.rbp))
}

/// Unwinds one frame: records `walk.ip`, then moves `walk` to the caller. Returns 1 to stop.
#[inline(never)]
extern "C" fn step(index: u64, walk: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the stack slot `cfi_stack` gave it, which holds this CPU's
    // walk.
    let walk = unsafe { &mut **(walk as *mut *mut Walk) };
    let Some(frames) = crate::SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's scratch slot.
    let frames = unsafe { &mut *frames };
    // One iteration per frame: a scan runs in a loop of its own (`start_scan`).
    let i = index as usize;
    if i >= MAX_STACK_DEPTH {
        return 1;
    }
    frames.ips[i] = walk.ip;
    walk.len = i as u32 + 1;
    if walk.hotspot.code_start <= walk.ip && walk.ip < walk.hotspot.code_end {
        let j = walk.java_len as usize;
        if j < MAX_STACK_DEPTH {
            walk.java[j & (MAX_STACK_DEPTH - 1)] = walk.ip;
            walk.java_len = j as u32 + 1;
        }
    }
    let exact = i == 0 || walk.exact_ip != 0;
    walk.exact_ip = 0;
    match unwind_frame(walk, exact) {
        WalkEnd::Running => 0,
        end => {
            walk.end = end as u32;
            1
        }
    }
}

#[inline(always)]
fn unwind_frame(walk: &mut Walk, innermost: bool) -> WalkEnd {
    // A return address points after the call; the call itself belongs to the caller's row.
    let pc = if innermost { walk.ip } else { walk.ip - 1 };
    let mapping = if walk.mapping.start <= pc && pc < walk.mapping.end {
        walk.mapping
    } else {
        match find_mapping(walk.tgid, pc) {
            Some(m) => {
                walk.mapping = m;
                m
            }
            None => return WalkEnd::Early,
        }
    };
    let row = if mapping.rows > 0 {
        find_row(&mapping, pc.wrapping_sub(mapping.bias))
    } else {
        None
    };
    let (cfa, ra_at, rbp_at) = match row {
        Some(row) if row.cfa_rule() == CfaRule::EndOfStack as u8 => return WalkEnd::Complete,
        Some(row) if row.cfa_rule() == CfaRule::SignalFrame as u8 => return signal_frame(walk),
        Some(row) if row.cfa_rule() == CfaRule::HotspotInterpreter as u8 => {
            return hotspot_interpreter_frame(walk)
        }
        Some(row) if row.cfa_rule() == CfaRule::RbpDeref as u8 => {
            // A realigned frame: the CFA was saved below the frame pointer, and the caller's
            // rbp at it.
            let at = walk.bp.wrapping_sub(row.cfa_offset as u64);
            // SAFETY: user memory read through the checked helper.
            let Ok(cfa) = (unsafe { bpf_probe_read_user(at as *const u64) }) else {
                return WalkEnd::Early;
            };
            (
                cfa,
                cfa.wrapping_add(RETURN_ADDRESS_OFFSET as u64),
                Some(walk.bp),
            )
        }
        Some(row) if row.cfa_rule() != CfaRule::NoInfo as u8 => {
            let rule = row.cfa_rule();
            let offset = row.cfa_offset as u64;
            let cfa = if rule == CfaRule::Rsp as u8 {
                walk.sp.wrapping_add(offset)
            } else if rule == CfaRule::Rbp as u8 {
                walk.bp.wrapping_add(offset)
            } else {
                // PLT stub: 8 more once the stub has pushed its relocation index.
                let extra = if walk.ip & 15 >= row.plt_threshold() as u64 {
                    8
                } else {
                    0
                };
                walk.sp.wrapping_add(offset + extra)
            };
            let rbp_at = row
                .rbp_offset()
                .map(|off| cfa.wrapping_add(off as i64 as u64));
            (cfa, cfa.wrapping_add(RETURN_ADDRESS_OFFSET as u64), rbp_at)
        }
        // No CFI for this pc (JIT code, objects without .eh_frame or whose table is not
        // loaded yet): frame pointer, else a scan.
        _ => return no_cfi_frame(walk),
    };
    // The stack grows down: a caller's frame lies above. Anything else is a loop or garbage.
    if cfa <= walk.sp {
        return WalkEnd::Early;
    }
    // The saved rbp first: it lies below the return address, so that a window read for it
    // holds the return address too.
    if let Some(at) = rbp_at {
        match read_stack(walk, at) {
            Some(bp) => walk.bp = bp,
            None => return WalkEnd::Early,
        }
    }
    let Some(ra) = read_stack(walk, ra_at) else {
        return WalkEnd::Early;
    };
    if ra == 0 {
        return WalkEnd::Complete;
    }
    walk.ip = ra;
    walk.sp = cfa;
    WalkEnd::Running
}

/// The user word at `at`, from the walk's stack window when it holds it, else read with a
/// new window from `at` (or alone, near the top of the stack where a window's bytes are not
/// all mapped).
#[inline(always)]
fn read_stack(walk: &mut Walk, at: u64) -> Option<u64> {
    let offset = at.wrapping_sub(walk.window_at);
    if offset & 7 == 0 && offset < walk.window_len {
        return Some(walk.window[(offset / 8) as usize & (STACK_WINDOW_WORDS - 1)]);
    }
    // SAFETY: user memory read through the checked helper, into this CPU's walk.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            walk.window.as_mut_ptr().cast(),
            (STACK_WINDOW_WORDS * 8) as u32,
            at as *const core::ffi::c_void,
        )
    };
    if read == 0 {
        walk.window_at = at;
        walk.window_len = (STACK_WINDOW_WORDS * 8) as u64;
        return Some(walk.window[0]);
    }
    walk.window_len = 0;
    // SAFETY: user memory read through the checked helper.
    unsafe { bpf_probe_read_user(at as *const u64) }.ok()
}

/// Unwinds a frame that no CFI covers. By its frame pointer when that leads above the frame
/// into executable code (code built with frame pointers and no CFI); else, since JIT code and
/// hand-written assembly use rbp as they please, by scanning the stack above it.
#[inline(always)]
fn no_cfi_frame(walk: &mut Walk) -> WalkEnd {
    let bp = walk.bp;
    if bp == 0 {
        // The outermost frame by the ABI's convention, unless a scan finds a caller.
        return start_scan(walk, WalkEnd::Complete);
    }
    // A frame pointer equal to sp is a frame that just set it up.
    if bp >= walk.sp {
        if walk.v8_on != 0 {
            // V8's generated code has no CFI and keeps frame pointers: its JavaScript frames
            // are told apart here (`walk.len - 1` is this frame's index).
            crate::v8::record_frame(&walk.v8, walk.len.wrapping_sub(1), walk.ip, bp);
        }
        // SAFETY: user memory read through the checked helper.
        let read = unsafe {
            (
                bpf_probe_read_user(bp.wrapping_add(8) as *const u64),
                bpf_probe_read_user(bp as *const u64),
            )
        };
        if let (Ok(ra), Ok(next_bp)) = read {
            if ra == 0 {
                return WalkEnd::Complete;
            }
            if find_mapping(walk.tgid, ra - 1).is_some() {
                walk.fp_frames += 1;
                walk.ip = ra;
                walk.sp = bp.wrapping_add(16);
                walk.bp = next_bp;
                return WalkEnd::Running;
            }
        }
    }
    start_scan(walk, WalkEnd::Early)
}

/// Scans the stack from `walk.sp` for the frame's return address (a nested `bpf_loop`, one
/// word an iteration, verified apart from the frame loop); the walk ends with `fails` if no
/// scan is left or the scan finds nothing.
#[inline(always)]
fn start_scan(walk: &mut Walk, fails: WalkEnd) -> WalkEnd {
    if walk.scans_left == 0 {
        return fails;
    }
    walk.scans_left -= 1;
    walk.scan_found = 0;
    let mut slot: *mut Walk = walk;
    // SAFETY: `scan_word` has the callback signature bpf_loop expects and `slot` outlives
    // the call.
    unsafe {
        bpf_loop(
            STACK_SCAN_WORDS,
            scan_word as *mut _,
            (&mut slot as *mut *mut Walk).cast(),
            0,
        )
    };
    if walk.scan_found != 0 {
        WalkEnd::Running
    } else {
        fails
    }
}

/// Lowest address a return address can have: below it are small integers, never code.
const MIN_CODE_ADDRESS: u64 = 0x1000;
/// One past the highest user address on x86-64 with 4-level paging: stack words above it
/// are kernel addresses or garbage, never user code.
const USER_CODE_LIMIT: u64 = 1 << 47;

/// Reads stack word `index` above `walk.sp`: when it is a return address into code with CFI,
/// right after a call, it becomes the next frame (its stack pointer the word's address plus
/// 8) and the scan stops. Returns 1 to stop.
#[inline(never)]
extern "C" fn scan_word(index: u64, walk: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the stack slot `start_scan` gave it, as for `step`.
    let walk = unsafe { &mut **(walk as *mut *mut Walk) };
    let at = walk.sp.wrapping_add(index.wrapping_mul(8));
    // SAFETY: user memory read through the checked helper.
    let Ok(word) = (unsafe { bpf_probe_read_user(at as *const u64) }) else {
        // Past the top of the stack.
        return 1;
    };
    if let Some((mapping, row)) = return_address_with_cfi(walk.tgid, word) {
        walk.ip = word;
        walk.sp = at.wrapping_add(8);
        walk.mapping = mapping;
        walk.scan_found = 1;
        walk.scanned += 1;
        if row.cfa_rule() == CfaRule::Rbp as u8 || row.cfa_rule() == CfaRule::RbpDeref as u8 {
            walk.bp = caller_frame_pointer(walk);
        }
        return 1;
    }
    0
}

/// How far above the stack pointer a frame pointer may point: a frame of up to 1 MiB.
const FRAME_POINTER_REACH: u64 = 1 << 20;

/// The frame pointer of a frame found by scanning whose CFA is rbp-based (oneDNN's C++
/// functions, which call its JIT kernels, keep frame pointers): rbp if the code without CFI
/// left it pointing into the stack above, else the first of the words just below the
/// return address that does: code that follows the ABI pushes the callee-saved registers it
/// uses there (oneDNN's JIT kernels push rbx, then rbp; a compiler's prologue pushes rbp
/// first). A wrong pick ends the walk early, as it would have ended without one. Branch-free:
/// with branches and reads per candidate the verifier went past its instruction limit.
#[inline(always)]
fn caller_frame_pointer(walk: &Walk) -> u64 {
    let sp = walk.sp;
    // 1 when `bp` points at most FRAME_POINTER_REACH above sp.
    let plausible = |bp: u64| {
        let above = bp.wrapping_sub(sp);
        (above.wrapping_sub(FRAME_POINTER_REACH) >> 63) & !(above >> 63)
    };
    // The two words below the return address (at sp - 8): [rbp-or-r12, rbx-or-rbp].
    // SAFETY: user memory read through the checked helper.
    let [lower, upper] =
        unsafe { bpf_probe_read_user(sp.wrapping_sub(24) as *const [u64; 2]) }.unwrap_or([0; 2]);
    let k0 = plausible(walk.bp);
    let k1 = plausible(lower) & (1 - k0);
    let k2 = plausible(upper) & (1 - k0) & (1 - k1);
    let none = 1 - k0 - k1 - k2;
    k0.wrapping_mul(walk.bp)
        | k1.wrapping_mul(lower)
        | k2.wrapping_mul(upper)
        | none.wrapping_mul(walk.bp)
}

/// The mapping of `word` and the row of its pc when it is a return address into code with
/// CFI: inside an executable mapping with a table, right after a call instruction, at a pc
/// that a row covers.
#[inline(always)]
fn return_address_with_cfi(tgid: u32, word: u64) -> Option<(UnwindMapping, UnwindRow)> {
    if !(MIN_CODE_ADDRESS..USER_CODE_LIMIT).contains(&word) {
        return None;
    }
    let pc = word - 1;
    let mapping = find_mapping(tgid, pc)?;
    if mapping.rows == 0 {
        return None;
    }
    // SAFETY: user memory read through the checked helper.
    let code = unsafe { bpf_probe_read_user((word - 8) as *const u64) }.ok()?;
    if !follows_call(code) {
        return None;
    }
    let row = find_row(&mapping, pc.wrapping_sub(mapping.bias))?;
    if row.cfa_rule() == CfaRule::NoInfo as u8 {
        return None;
    }
    Some((mapping, row))
}

/// Unwinds a signal trampoline: the interrupted frame's registers are in the ucontext at rsp.
#[inline(always)]
fn signal_frame(walk: &mut Walk) -> WalkEnd {
    let context = walk.sp;
    // SAFETY: user memory read through the checked helper.
    let regs = unsafe {
        (
            bpf_probe_read_user((context + SIGNAL_FRAME_RIP) as *const u64),
            bpf_probe_read_user((context + SIGNAL_FRAME_RSP) as *const u64),
            bpf_probe_read_user((context + SIGNAL_FRAME_RBP) as *const u64),
        )
    };
    let (Ok(ip), Ok(sp), Ok(bp)) = regs else {
        return WalkEnd::Early;
    };
    if ip == 0 || sp == 0 {
        return WalkEnd::Early;
    }
    walk.ip = ip;
    walk.sp = sp;
    walk.bp = bp;
    // The interrupted instruction had not run: no return-address adjustment for its lookup.
    walk.exact_ip = 1;
    WalkEnd::Running
}

/// The executable mapping of process `tgid` that holds `pc`.
#[inline(always)]
fn find_mapping(tgid: u32, pc: u64) -> Option<UnwindMapping> {
    // SAFETY: the value is copied out entry by entry.
    let process = unsafe { UNWIND_PROCESSES.get(tgid) }?;
    let len = process.len as usize;
    if len == 0 || len > MAX_UNWIND_MAPPINGS {
        return None;
    }
    // Largest index whose start is <= pc.
    let mut lo = 0usize;
    let mut n = len;
    let mut step = 0;
    while step < UNWIND_MAPPING_SEARCH_STEPS && n > 1 {
        let half = n / 2;
        // Masked rather than checked (the length is a power of two and `mid` below `len`):
        // one path for the verifier instead of an exit per step (108k -> 75k verified
        // instructions for the walker program).
        let mid = (lo + half) & (MAX_UNWIND_MAPPINGS - 1);
        // Branch-free, as in `find_row`: 1 when the mapping starts at or below pc.
        let take = (process.mappings[mid].start.wrapping_sub(pc + 1) >> 63) as usize;
        lo += half * take;
        n -= half;
        step += 1;
    }
    let mapping = process.mappings[lo & (MAX_UNWIND_MAPPINGS - 1)];
    if mapping.start <= pc && pc < mapping.end {
        Some(mapping)
    } else {
        None
    }
}

/// Slots of [`ROW_CACHE`]: a power of two, since slot numbers are masked.
const ROW_CACHE_SLOTS: u32 = 256;
const _: () = assert!(ROW_CACHE_SLOTS.is_power_of_two());

/// Each CPU's recently found rows: the slot of a (table, pc) pair ([`row_cache_slot`]) holds the
/// index of the row that covered that pc when it was last looked up. A sampled program returns
/// to the same few dozen addresses sample after sample (an interpreter's eval loop, a
/// recursion), and a large table's bisection is up to 22 steps through an array of megabytes,
/// most of them cache misses. A slot is only a hint: its row is used when it and the next one
/// bracket the pc within the mapping's table, which makes it the row the bisection finds
/// whatever the array holds now (a table replaced since, a slot two pcs share).
#[map]
static ROW_CACHE: PerCpuArray<u32> = PerCpuArray::with_max_entries(ROW_CACHE_SLOTS, 0);

/// The [`ROW_CACHE`] slot of object address `pc` in the table from row `first_row`.
#[inline(always)]
fn row_cache_slot(first_row: u32, pc: u32) -> u32 {
    ((pc ^ first_row.rotate_left(16)).wrapping_mul(0x9e37_79b1) >> 24) & (ROW_CACHE_SLOTS - 1)
}

/// Row `index` when it is the row of `mapping`'s table that holds `pc`: in the table, at or
/// below `pc`, and the table's last row or followed by one above `pc`.
#[inline(always)]
fn cached_row(mapping: &UnwindMapping, pc: u32, index: u32) -> Option<UnwindRow> {
    let end = mapping.first_row.wrapping_add(mapping.rows);
    if index < mapping.first_row || index >= end {
        return None;
    }
    let row = *UNWIND_ROWS.get(index)?;
    if row.pc > pc {
        return None;
    }
    if index + 1 < end && UNWIND_ROWS.get(index + 1)?.pc <= pc {
        return None;
    }
    Some(row)
}

/// The row of `mapping`'s table that holds at object address `pc`: this CPU's cached row when
/// it still holds it, else found by bisection and cached.
#[inline(always)]
fn find_row(mapping: &UnwindMapping, pc: u64) -> Option<UnwindRow> {
    if pc > u32::MAX as u64 {
        return None;
    }
    let pc = pc as u32;
    let slot = ROW_CACHE.get_ptr_mut(row_cache_slot(mapping.first_row, pc))?;
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU (and a tracepoint
    // program that interrupted one could only leave a hint that is checked before use).
    if let Some(row) = cached_row(mapping, pc, unsafe { *slot }) {
        return Some(row);
    }
    let mut lo = mapping.first_row;
    let mut n = mapping.rows;
    let mut step = 0;
    while step < UNWIND_TABLE_SEARCH_STEPS && n > 1 {
        let half = n / 2;
        let mid = lo + half;
        let row = UNWIND_ROWS.get(mid)?;
        // Branch-free: 1 when row.pc <= pc. Without a branch per step the verifier checks
        // one path through the bisection instead of one per outcome.
        let take = ((row.pc as u64).wrapping_sub(pc as u64 + 1) >> 63) as u32;
        lo += half * take;
        n -= half;
        step += 1;
    }
    let row = *UNWIND_ROWS.get(lo)?;
    if row.pc <= pc {
        // SAFETY: as above.
        unsafe { *slot = lo };
        Some(row)
    } else {
        None
    }
}
