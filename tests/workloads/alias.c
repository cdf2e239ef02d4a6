/*
 * alias: a workload that aliases with fixed sampling intervals. Each 10 ms period, exactly,
 * it busy-waits 7.5 ms in leaf_hot, then 2.5 ms in leaf_cold, on absolute deadlines of the
 * monotonic clock, so the period does not drift. 10 ms is a multiple of 100 Hz's period: a
 * sampler with a fixed interval sees the same phase of the loop again and again, and its
 * share for leaf_hot lands anywhere from 0 to 100% instead of 75% (bench/alias.c is the
 * bench's copy, on the TSC).
 *
 * Usage: alias PERIODS
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void leaf_hot(uint64_t until)
{
    while (now_ns() < until)
        ;
}

__attribute__((noinline)) void leaf_cold(uint64_t until)
{
    while (now_ns() < until)
        ;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: alias PERIODS\n");
        return 2;
    }
    uint64_t periods = strtoull(argv[1], 0, 10);
    uint64_t base = now_ns();
    for (uint64_t k = 0; k < periods; k++) {
        leaf_hot(base + k * 10000000ull + 7500000ull);
        leaf_cold(base + (k + 1) * 10000000ull);
    }
    return 0;
}
