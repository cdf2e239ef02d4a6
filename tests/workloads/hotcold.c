/*
 * hotcold: deterministic CPU split between two call chains.
 *
 *   main -> parent_hot  -> leaf_hot   burns 3 units per round
 *   main -> parent_cold -> leaf_cold  burns 1 unit per round
 *
 * The burn loops live inside the leaf functions (with a volatile accumulator)
 * so that the sampled instruction pointer is almost always in a leaf and a
 * frame-pointer unwinder sees leaf -> parent -> main.  Work is counted in
 * iterations, not time, so the true split leaf_hot:leaf_cold is 75:25 by CPU
 * time regardless of scheduling.  One unit is ~90 us at -O0 here, so one
 * round (4 units, ~350 us) is not a divisor of common sampling periods
 * (1 ms at 999-1000 Hz), which avoids aliasing between rounds and samples.
 *
 * Usage: hotcold [SECONDS]   (default: run forever)
 */
#include <stdlib.h>
#include <time.h>

#define UNIT_ITERS 70000UL

volatile unsigned long sink;

__attribute__((noinline)) void leaf_hot(void)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 3 * UNIT_ITERS; i++)
        acc += i;
    sink = acc;
}

__attribute__((noinline)) void leaf_cold(void)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 1 * UNIT_ITERS; i++)
        acc += i;
    sink = acc;
}

__attribute__((noinline)) void parent_hot(void)
{
    leaf_hot();
}

__attribute__((noinline)) void parent_cold(void)
{
    leaf_cold();
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.0;
    double end = now() + secs;
    for (;;) {
        /* 64 rounds between clock checks keeps the time check negligible. */
        for (int r = 0; r < 64; r++) {
            parent_hot();
            parent_cold();
        }
        if (secs > 0 && now() >= end)
            break;
    }
    return 0;
}
