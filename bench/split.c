/* Accuracy workload: CPU time split between leaf_hot and leaf_cold, 75:25 in expectation, in
 * chunks of random length and random order (a fixed seed), so that the sequence has no period
 * a sampling clock could lock onto. The true split is measured, not assumed: each chunk's
 * thread CPU time is added to its function's total, and "truth P" prints leaf_hot's share in
 * percent.
 *
 * usage: split CHUNKS */
#include "common.h"

/* Identical loops, so an iteration costs the same in both; the constants differ only so that
 * no compiler merges the two functions. */
__attribute__((noinline)) uint64_t leaf_hot(uint64_t n) {
    uint64_t x = n | 1;
    for (uint64_t i = 0; i < n; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    keep_frame(x);
    return x;
}

__attribute__((noinline)) uint64_t leaf_cold(uint64_t n) {
    uint64_t x = n | 3;
    for (uint64_t i = 0; i < n; i++)
        x = x * 6364136223846793005ull + 1442695040888963409ull;
    keep_frame(x);
    return x;
}

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: split CHUNKS\n");
        return 2;
    }
    uint64_t chunks = strtoull(argv[1], 0, 10);
    uint64_t seed = 0x9e3779b97f4a7c15ull, sink = 0, hot_ns = 0, cold_ns = 0;
    uint64_t start = mono_ns();
    for (uint64_t c = 0; c < chunks; c++) {
        uint64_t r = xorshift(&seed);
        /* 20k to 200k iterations: tens to a few hundred microseconds. */
        uint64_t n = 20000 + r % 180000;
        int hot = (r >> 40) % 4 != 0;
        uint64_t t0 = thread_cpu_ns();
        sink += hot ? leaf_hot(n) : leaf_cold(n);
        uint64_t t1 = thread_cpu_ns();
        *(hot ? &hot_ns : &cold_ns) += t1 - t0;
    }
    printf("secs %.6f\n", (mono_ns() - start) / 1e9);
    printf("truth %.4f\n", 100.0 * hot_ns / (double)(hot_ns + cold_ns));
    printf("sink %llu\n", (unsigned long long)(sink & 1));
    print_cpu();
    done();
    return 0;
}
