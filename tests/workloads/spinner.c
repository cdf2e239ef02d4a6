/*
 * spinner: a second busy process used to check that profiling one pid does
 * not pick up samples from another.  All its CPU time is in other_spin.
 *
 * Usage: spinner [SECONDS]   (default: run forever)
 */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void other_spin(void)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 200000UL; i++)
        acc += i;
    sink = acc;
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
        for (int r = 0; r < 16; r++)
            other_spin();
        if (secs > 0 && now() >= end)
            break;
    }
    return 0;
}
