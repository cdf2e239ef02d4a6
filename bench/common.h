/* Shared by the bench workloads: clocks and a busy-wait that keeps the sampled IP in the
 * caller. The workloads are compiled by `cargo xtask bench` (xtask/src/bench.rs) with
 * -O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -fno-optimize-sibling-calls
 * -fno-ipa-icf, so every function keeps its own frame and none is merged with a twin. */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static inline uint64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Busy-waits read the TSC inline instead of calling clock_gettime: a sample taken inside the
 * vDSO or libc (no frame pointers there) can lose the calling frame, and the point of the
 * timed workloads is that the function doing the waiting is the sampled IP. */
static double tsc_per_ns = 1.0;
#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t ticks(void) { return __rdtsc(); }
/* Measures the TSC rate against CLOCK_MONOTONIC (50 ms). */
static inline void calibrate_ticks(void) {
    uint64_t t0 = mono_ns(), c0 = __rdtsc();
    while (mono_ns() - t0 < 50000000ull) {
    }
    uint64_t t1 = mono_ns(), c1 = __rdtsc();
    tsc_per_ns = (double)(c1 - c0) / (double)(t1 - t0);
}
/* The tick count `ns` nanoseconds after `base_ns` (a mono_ns() reading taken with `base`). */
static inline uint64_t ticks_after(uint64_t base, uint64_t ns) {
    return base + (uint64_t)(ns * tsc_per_ns);
}
#else
static inline uint64_t ticks(void) { return mono_ns(); }
static inline void calibrate_ticks(void) {}
static inline uint64_t ticks_after(uint64_t base, uint64_t ns) { return base + ns; }
#endif

/* Called once as the last thing a leaf does. gcc 12 at -O2 gives a function that calls nothing
 * no frame at all, -mno-omit-leaf-frame-pointer notwithstanding; a sample in it then shows its
 * caller's caller as the parent and the caller is lost from the stack. A call makes it a
 * non-leaf with a frame (and -fno-shrink-wrap keeps that frame around the loop too). */
__attribute__((noinline)) void keep_frame(uint64_t x) { __asm__ volatile("" : : "r"(x)); }

/* Prints the process's CPU seconds (all threads), so the bench can subtract the workload's CPU
 * from a profiler's rusage when the workload is the profiler's child. */
static inline void print_cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("cpu %.6f\n", u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
                             u.ru_stime.tv_usec / 1e6);
}

/* With BENCH_LINGER set, a workload that has finished its work stays alive (idle) until it is
 * killed: bpftrace resolves user stacks when it prints, at exit, and a process that has
 * already exited would print as bare addresses. */
static void done(void) {
    printf("done\n");
    fflush(stdout);
    if (getenv("BENCH_LINGER"))
        for (;;)
            pause();
}

#endif
