/* Start-up workload: prints "start NS" (CLOCK_MONOTONIC at main) and then spends millisecond
 * k after that in slot_k, for k = 0..999. The first slot that shows up in a profile dates the
 * profiler's first sample to within a millisecond, on the same clock the bench reads when it
 * starts the profiler's command.
 *
 * The TSC rate is measured beforehand (`startup --calibrate` prints "tsc_per_ns R") and passed
 * in, so that the program's first millisecond is already slot_000.
 *
 * usage: startup TSC_PER_NS | startup --calibrate */
#include "common.h"

static uint64_t base;

/* 1000 functions slot_000 .. slot_999, each busy until the end of its millisecond. */
#define SLOT(n)                                                                                \
    __attribute__((noinline)) void slot_##n(uint64_t k) {                                     \
        uint64_t until = ticks_after(base, (k + 1) * 1000000ull);                              \
        while (ticks() < until) {                                                              \
        }                                                                                      \
        keep_frame(until);                                                                     \
    }
#define PTR(n) slot_##n,
#define X10(m, p) m(p##0) m(p##1) m(p##2) m(p##3) m(p##4) m(p##5) m(p##6) m(p##7) m(p##8) m(p##9)
#define X100(m, p)                                                                             \
    X10(m, p##0) X10(m, p##1) X10(m, p##2) X10(m, p##3) X10(m, p##4) X10(m, p##5) X10(m, p##6) \
        X10(m, p##7) X10(m, p##8) X10(m, p##9)
#define X1000(m)                                                                               \
    X100(m, 0) X100(m, 1) X100(m, 2) X100(m, 3) X100(m, 4) X100(m, 5) X100(m, 6) X100(m, 7)     \
        X100(m, 8) X100(m, 9)

X1000(SLOT)

static void (*const slots[1000])(uint64_t) = {X1000(PTR)};

int main(int argc, char **argv) {
    uint64_t start = mono_ns();
    base = ticks();
    if (argc < 2) {
        fprintf(stderr, "usage: startup TSC_PER_NS | startup --calibrate\n");
        return 2;
    }
    if (argv[1][0] == '-') {
        calibrate_ticks();
        printf("tsc_per_ns %.9f\n", tsc_per_ns);
        return 0;
    }
#if defined(__x86_64__)
    tsc_per_ns = strtod(argv[1], 0);
#endif
    printf("start %llu\n", (unsigned long long)start);
    fflush(stdout);
    for (uint64_t k = 0; k < 1000; k++)
        slots[k](k);
    done();
    return 0;
}
