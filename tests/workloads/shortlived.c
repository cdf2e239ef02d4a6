/*
 * shortlived: burns one second of its own CPU time in short_work, then exits.
 * CPU time, not wall time, so that a loaded machine (tests run in parallel on
 * two cores) still gives a profile of known size.  Used for "target exits
 * mid-run" and launch mode.
 *
 * Usage: shortlived [SECONDS]   (default: 1)
 */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void short_work(double secs)
{
    double end = now() + secs;
    volatile unsigned long acc = 0;
    while (now() < end) {
        for (unsigned long i = 0; i < 100000UL; i++)
            acc += i;
    }
    sink = acc;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    short_work(secs);
    return 0;
}
