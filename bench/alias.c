/* Aliasing workload: a 10 ms period, exactly, spent 7.5 ms in leaf_hot then 2.5 ms in
 * leaf_cold (busy-waits on absolute deadlines, so the period does not drift). 10 ms is a
 * multiple of the 100 Hz and 1000 Hz sampling periods: a sampler with a fixed interval sees
 * the same phase of the loop again and again, and its share for leaf_hot lands anywhere
 * between 0 and 100% instead of 75%.
 *
 * usage: alias PERIODS */
#include "common.h"

__attribute__((noinline)) void leaf_hot(uint64_t until) {
    while (ticks() < until) {
    }
    keep_frame(until);
}

__attribute__((noinline)) void leaf_cold(uint64_t until) {
    while (ticks() < until) {
    }
    keep_frame(until);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: alias PERIODS\n");
        return 2;
    }
    uint64_t periods = strtoull(argv[1], 0, 10);
    calibrate_ticks();
    uint64_t base = ticks();
    for (uint64_t k = 0; k < periods; k++) {
        leaf_hot(ticks_after(base, k * 10000000ull + 7500000ull));
        leaf_cold(ticks_after(base, (k + 1) * 10000000ull));
    }
    printf("truth 75.0000\n");
    print_cpu();
    done();
    return 0;
}
