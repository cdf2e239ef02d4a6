//! bpfprof's kernel side: a perf_event program that keeps only the samples of target
//! processes and counts them per (run, thread, user stack, kernel stack).
//!
//! The program runs on every sample of every CPU, so the common case — a sample of some other
//! process — must be cheap: it costs one helper call per watched pid namespace and one hash
//! lookup. Everything that can be done later (symbols, tags, truncation) is left to userspace.
#![no_std]
#![no_main]
// The BPF atomic add is reached through inline asm: the bpf target has no compare-and-swap, so
// `AtomicU64::fetch_add` does not exist there.
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, perf_event},
    maps::{Array, ProgramArray},
    programs::PerfEventContext,
};
use profiler_common::{Config, INVOCATIONS_INDEX, WALKER_SLOT};

/// Declares a classic tracepoint program `$name` that runs `$handler` on the tracepoint's
/// record and returns [`TRACEPOINT_KEEP_EVENT`].
///
/// aya-ebpf's `#[tracepoint]` cannot do this: the function it generates discards the value of
/// the one it wraps and returns 0, which drops the event for every other tool (see
/// [`TRACEPOINT_KEEP_EVENT`]). This is the same entry point (the `tracepoint` section, which
/// userspace loads and attaches by name) with the value kept.
macro_rules! tracepoint_program {
    ($(#[$doc:meta])* $name:ident => $handler:path) => {
        $(#[$doc])*
        #[no_mangle]
        #[link_section = "tracepoint"]
        pub fn $name(ctx: *mut core::ffi::c_void) -> u32 {
            $handler(&aya_ebpf::programs::TracePointContext::new(ctx));
            $crate::TRACEPOINT_KEEP_EVENT
        }
    };
}

/// What every classic tracepoint program returns: "pass the event on". The kernel runs the
/// programs attached to a tracepoint (`trace_call_bpf`, the AND of all their return values)
/// before the tracepoint's perf events, and a 0 drops the event for every perf event of that
/// tracepoint, machine-wide: `perf record -e sched:sched_switch`, `perf sched`, bpftrace and
/// another bpfprof would see none while a run is on. 1 leaves them as they were.
///
/// The perf_event programs return 0 instead: `bpf_overflow_handler` reads their value only to
/// decide whether the sample also goes to the ring buffer of the perf event they are attached
/// to, which is bpfprof's own (opened for it, never mapped), so other tools' events are
/// unaffected and 0 saves the copy.
pub(crate) const TRACEPOINT_KEEP_EVENT: u32 = 1;

mod off_cpu;
mod python;
mod record;
mod stacks;
mod targets;
mod timeline;
mod unwind;
mod v8;
mod waits;

// The modules' crate-wide items, reachable as `crate::name` from every module.
use record::*;
use stacks::*;
use targets::*;

/// `EEXIST`, as helpers return it negated.
pub(crate) const EEXIST: i32 = 17;

/// Settings userspace writes before attaching (`Config`).
#[map]
static CONFIG: Array<u64> = Array::with_max_entries(Config::COUNT, 0);

/// The walker program (CFI and Python walks) at [`WALKER_SLOT`] once userspace has loaded it.
/// It takes twice as long to verify as the sampling program (20k verified instructions against
/// 10k), so userspace starts sampling with the sampling program alone and adds the walker from
/// a background thread: samples taken before that use frame pointers and are counted as such.
#[map]
static WALKERS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The sampling program: keeps target samples, with frame-pointer stacks, and hands samples of
/// processes that need the CFI or Python walk to the walker program.
#[perf_event]
pub fn bpfprof_sample(ctx: PerfEventContext) -> u32 {
    increment(INVOCATIONS_INDEX);
    if let Some(target) = current_target() {
        if target.skip_kernel_threads && is_kernel_thread(&ctx) {
            return 0;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if target.system {
            report_new_process(tgid);
        }
        let wants_walker = unwind::is_unwound(tgid) || python::is_python(tgid);
        if wants_walker {
            hand_off(&target);
            // SAFETY: the context is this program's own; the call does not return when the
            // walker is loaded.
            unsafe { WALKERS.tail_call(&ctx, WALKER_SLOT) };
        }
        record::<false>(&ctx, &target, wants_walker);
    }
    0
}

/// The walker program: records the sample with the CFI walk of its user stack and the Python
/// walk of its interpreter frames. Reached only by tail call from `bpfprof_sample`.
#[perf_event]
pub fn bpfprof_walk(ctx: PerfEventContext) -> u32 {
    if let Some(target) = handed_target().or_else(current_target) {
        record::<true>(&ctx, &target, false);
    }
    0
}

/// An entry of the configuration array; 0 when unset.
#[inline(always)]
pub(crate) fn config(entry: Config) -> u64 {
    match CONFIG.get(entry as u32) {
        Some(v) => *v,
        None => 0,
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
