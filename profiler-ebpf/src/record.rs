//! Counting a sample: its stacks stored, one count per set of runs, the per-run counters.

use crate::{python, store_stack, timeline, unwind, CurrentTarget, EEXIST};
use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::generated::bpf_loop,
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use profiler_common::{
    Counter, SampleKey, SampleKind, SampleValue, ALL_RUNS_SAMPLES_INDEX, COUNTER_ENTRIES, MAX_RUNS,
    SAMPLE_MAP_ENTRIES,
};

/// Sample counts (and off-CPU time) by (runs, thread, user stack, kernel stack, Python stack,
/// kind).
#[map]
pub(crate) static SAMPLES: HashMap<SampleKey, SampleValue> =
    HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

/// Per-run counters (`Counter`), per CPU so that no atomics are needed.
#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);

/// Records one sample for every run of `target`: the stacks are stored once and one count
/// (keyed by the set of runs) goes up; only the per-run counters are kept per run. `WALK`
/// (the walker program) walks user stacks by CFI and Python frames; without it the kernel's
/// frame-pointer walk is used, and `walker_missed` says the process wanted the walker.
#[inline(always)]
pub(crate) fn record<const WALK: bool>(
    ctx: &PerfEventContext,
    target: &CurrentTarget,
    walker_missed: bool,
) {
    let runs = target.runs;
    if runs == 0 {
        return;
    }
    increment(ALL_RUNS_SAMPLES_INDEX);
    // The walks' own statistics (CFI stacks, walks that ended early, frame-pointer frames,
    // Python stacks) go to the lowest run of the sample only: they describe the unwinder, and
    // one count per sample is what they need.
    let stats_run = lowest_bit(runs);
    let user_stack = if WALK {
        // Processes userspace loaded CFI tables for are walked by `unwind`; the rest by the
        // kernel's frame-pointer walk.
        let id = match unwind::user_registers(ctx) {
            Some((ip, sp, bp)) => unwind::cfi_stack(ip, sp, bp, stats_run),
            None => unwind::NOT_UNWOUND,
        };
        if id == unwind::NOT_UNWOUND {
            store_stack(ctx, BPF_F_USER_STACK as u64)
        } else {
            Ok(id)
        }
    } else {
        store_stack(ctx, BPF_F_USER_STACK as u64)
    };
    // A sample taken in user mode has no kernel stack: the helper would find none, after
    // taking a callchain buffer and zeroing 1 KiB of scratch (about 80 ns of the sample's
    // 1.4 µs on a busy program; most of its samples are in user mode). The id and the
    // counter are plain numbers, each set on every path: with a `Result` here LLVM left the
    // unused half of the Ok path's value unset and read it, which the verifier rejects
    // ("R4 !read_ok").
    let (kernel_stack, kernel_loss) = if unwind::in_user_mode(ctx) {
        (0, NO_COUNTER)
    } else {
        match store_stack(ctx, 0) {
            Ok(id) => (id, NO_COUNTER),
            Err(c) => (0, c as u32),
        }
    };
    let python_stack = if WALK {
        match python::bpfprof_python_stack(stats_run) {
            // A process runs one runtime: V8's frames, recorded by the CFI walk, otherwise.
            0 => crate::v8::store(stats_run),
            id => id,
        }
    } else {
        0
    };
    let key = SampleKey {
        runs,
        pid: target.task.tgid,
        tid: target.task.pid,
        user_stack: user_stack.unwrap_or(0),
        kernel_stack,
        // A process runs one runtime: a JVM's frames when it has no Python stack.
        runtime_stack: if python_stack != 0 || !WALK {
            python_stack
        } else {
            unwind::take_hotspot_stack()
        },
        kind: SampleKind::Cpu as u32,
        reserved: 0,
    };
    let map_full = !increment_sample(&key, 0);
    let timeline_lost = !timeline::record(&key);
    // One set of counter bits rather than the counters themselves: to the verifier, every
    // combination of these outcomes is then the same unknown number, and it checks what follows
    // once instead of once per combination (it followed this tail up to 143 times).
    let mut counters = 1 << Counter::Samples as u32;
    if let Err(c) = user_stack {
        counters |= 1 << c as u32;
    }
    counters |= counter_bit(kernel_loss);
    if map_full {
        counters |= 1 << Counter::SampleMapFull as u32;
    }
    if timeline_lost {
        counters |= 1 << Counter::TimelineLost as u32;
    }
    if walker_missed {
        counters |= 1 << Counter::CfiNotReady as u32;
    }
    count_runs(runs, counters);
}

/// Adds one to each counter of the set `counters` (bit `c` for `Counter` `c`) for every run
/// of `runs`.
#[inline(always)]
pub(crate) fn count_runs(runs: u64, counters: u64) {
    bpfprof_count_runs(runs, counters);
}

/// [`count_runs`] itself. A global function, which the verifier checks once on its own, with
/// both arguments unknown: inlined, it was checked again for every combination of counters its
/// callers could pass (each a constant to the verifier).
#[no_mangle]
#[inline(never)]
pub extern "C" fn bpfprof_count_runs(runs: u64, counters: u64) -> u64 {
    if runs == 0 {
        return 0;
    }
    if runs & (runs - 1) == 0 {
        // One run, the common case: no loop at all.
        count_run_counters(lowest_bit(runs), counters);
    } else {
        // Several runs watch this process. A bounded loop over every run slot would be
        // verified once per slot; under bpf_loop the body is verified once.
        let mut counts = RunCounts { runs, counters };
        // SAFETY: `count_run` has the callback signature bpf_loop expects, and `counts`
        // outlives the call.
        unsafe {
            bpf_loop(
                MAX_RUNS,
                count_run as *mut _,
                (&mut counts as *mut RunCounts).cast(),
                0,
            )
        };
    }
    0
}

/// What to count for each run of a sample, shared with the `bpf_loop` callback.
#[repr(C)]
pub(crate) struct RunCounts {
    runs: u64,
    /// The counters to add one to, as bits (bit `c` for `Counter` `c`).
    counters: u64,
}

/// The bit of `counter` in a set for [`count_runs`]; none for [`NO_COUNTER`].
#[inline(always)]
pub(crate) fn counter_bit(counter: u32) -> u64 {
    if counter < Counter::COUNT {
        1 << counter
    } else {
        0
    }
}

/// No counter: a loss that did not happen (see `OffCpuPending::stack_losses`).
pub(crate) const NO_COUNTER: u32 = u32::MAX;

/// The `bpf_loop` callback: counts one sample for run `index` if the sample belongs to it.
extern "C" fn count_run(index: u64, counts: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the pointer `bpfprof_count_runs` gave it.
    let counts = unsafe { &*(counts as *const RunCounts) };
    let run = index as u32;
    if run >= MAX_RUNS {
        return 1;
    }
    if counts.runs & (1u64 << run) != 0 {
        count_run_counters(run, counts.counters);
    }
    0
}

/// Adds one to each counter of `counters` for `run`: one step per counter set, most often one.
#[inline(always)]
pub(crate) fn count_run_counters(run: u32, counters: u64) {
    if run >= MAX_RUNS {
        return;
    }
    let mut left = counters & ((1 << Counter::COUNT) - 1);
    let mut n = 0;
    while n < Counter::COUNT && left != 0 {
        increment(run * Counter::COUNT + lowest_bit(left));
        left &= left - 1;
        n += 1;
    }
}

/// Index of the lowest set bit of a non-zero `v` (BPF has no count-trailing-zeros): the number
/// of ones below it, counted without a branch. With branches the verifier would follow each of
/// the 64 possible results separately through everything after (the CFI walk included) and run
/// out of its instruction budget.
#[inline(always)]
pub(crate) fn lowest_bit(v: u64) -> u32 {
    let below = (v & v.wrapping_neg()).wrapping_sub(1);
    let mut c = below - ((below >> 1) & 0x5555_5555_5555_5555);
    c = (c & 0x3333_3333_3333_3333) + ((c >> 2) & 0x3333_3333_3333_3333);
    c = (c + (c >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    (c.wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32
}

/// Adds one to the count of `key` and `off_cpu_ns` to its time, inserting it if new; false
/// when the map is full.
#[inline(always)]
pub(crate) fn increment_sample(key: &SampleKey, off_cpu_ns: u64) -> bool {
    if let Some(value) = SAMPLES.get_ptr_mut(key) {
        add_sample(value, off_cpu_ns);
        return true;
    }
    let first = SampleValue {
        count: 1,
        off_cpu_ns,
    };
    match SAMPLES.insert(key, first, BPF_NOEXIST as u64) {
        Ok(()) => true,
        // Another CPU inserted the same key between our lookup and insert.
        Err(e) if e == -EEXIST => {
            if let Some(value) = SAMPLES.get_ptr_mut(key) {
                add_sample(value, off_cpu_ns);
            }
            true
        }
        Err(_) => false,
    }
}

#[inline(always)]
pub(crate) fn add_sample(value: *mut SampleValue, off_cpu_ns: u64) {
    // SAFETY: a field of a map value that stays valid while the program runs.
    unsafe {
        atomic_add(core::ptr::addr_of_mut!((*value).count), 1);
        if off_cpu_ns != 0 {
            atomic_add(core::ptr::addr_of_mut!((*value).off_cpu_ns), off_cpu_ns);
        }
    }
}

/// Adds one to `counter` of `run`; nothing for a run out of range (the off-CPU program's walks
/// pass [`MAX_RUNS`]: the unwinders' statistics describe samples).
#[inline(always)]
pub(crate) fn count(run: u32, counter: Counter) {
    if run < MAX_RUNS {
        increment(counter.index(run));
    }
}

/// This CPU's value of counter `index` (0 where it cannot be read).
#[inline(always)]
pub(crate) fn counter_value(index: u32) -> u64 {
    COUNTERS.get(index).copied().unwrap_or(0)
}

#[inline(always)]
pub(crate) fn increment(index: u32) {
    if let Some(value) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *value += 1 };
    }
}

#[inline(always)]
pub(crate) fn atomic_add(ptr: *mut u64, value: u64) {
    // SAFETY: `ptr` points into a map value that stays valid while the program runs.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({ptr} + 0) += {value}",
            ptr = in(reg) ptr,
            value = in(reg) value,
        )
    };
}
