/* Export bench workload (section 13): one small service of a fleet machine. It wakes every
 * PERIOD_MS, works BUSY_US in a call chain DEPTH frames deep (two leaves, so each process has
 * a few stacks per window) and sleeps again: fifty of them, with different depths, stand for
 * the processes a machine's windows hold. Runs until killed.
 *
 * usage: duty BUSY_US PERIOD_MS DEPTH */
#include "common.h"

static uint64_t busy_ns;

__attribute__((noinline)) uint64_t serve_request(uint64_t until) {
    uint64_t x = until | 1;
    while (ticks() < until)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    keep_frame(x);
    return x;
}

__attribute__((noinline)) uint64_t write_log(uint64_t until) {
    uint64_t x = until | 3;
    while (ticks() < until)
        x = x * 2862933555777941757ull + 3037000493ull;
    keep_frame(x);
    return x;
}

__attribute__((noinline)) uint64_t handle(int depth, uint64_t base) {
    if (depth > 0)
        return handle(depth - 1, base) + (uint64_t)depth;
    /* Three quarters serving, one quarter logging. */
    uint64_t served = serve_request(ticks_after(base, busy_ns * 3 / 4));
    return served + write_log(ticks_after(base, busy_ns));
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: duty BUSY_US PERIOD_MS DEPTH\n");
        return 2;
    }
    busy_ns = strtoull(argv[1], NULL, 10) * 1000ull;
    uint64_t period_ns = strtoull(argv[2], NULL, 10) * 1000000ull;
    int depth = atoi(argv[3]);
    calibrate_ticks();
    struct timespec pause_for = {.tv_sec = 0, .tv_nsec = 0};
    for (;;) {
        uint64_t start = mono_ns();
        keep_frame(handle(depth, ticks()));
        uint64_t spent = mono_ns() - start;
        uint64_t rest = spent < period_ns ? period_ns - spent : 0;
        pause_for.tv_sec = (time_t)(rest / 1000000000ull);
        pause_for.tv_nsec = (long)(rest % 1000000000ull);
        nanosleep(&pause_for, NULL);
    }
}
