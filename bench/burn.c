/* Overhead workload: a fixed amount of CPU-bound work (iteration counts, not time) split over
 * THREADS threads, one per core. Prints "secs S", the wall time of the work alone, so a
 * profiler's own start-up and shutdown are not in it. With ITERS = 0 each thread works until
 * the process is killed: a target to attach to.
 *
 * usage: burn ITERS_PER_THREAD THREADS [DEPTH] */
#include <pthread.h>

#include "common.h"

/* By default a stack a dozen frames deep, so that stack walking costs what it does in a real
 * program rather than the minimum; DEPTH up to 1000 gives deep stacks. */
static int depth = 8;
static uint64_t iters;

/* A multiply-add chain: each step needs the previous one, so the loop runs at the same speed
 * whatever the compiler does, touches no memory, and a profiler's cost shows in full. */
__attribute__((noinline)) uint64_t burn_leaf(uint64_t n) {
    uint64_t x = n | 1;
    for (uint64_t i = 0; n == 0 || i < n; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    keep_frame(x);
    return x;
}

__attribute__((noinline)) uint64_t descend(int depth, uint64_t n) {
    if (depth == 0)
        return burn_leaf(n);
    return descend(depth - 1, n) + (uint64_t)depth;
}

static void *worker(void *arg) {
    (void)arg;
    return (void *)(uintptr_t)descend(depth, iters);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: burn ITERS_PER_THREAD THREADS\n");
        return 2;
    }
    iters = strtoull(argv[1], 0, 10);
    int threads = atoi(argv[2]);
    if (argc > 3)
        depth = atoi(argv[3]);
    if (threads < 1 || threads > 256 || depth < 0 || depth > 1000)
        return 2;
    pthread_t t[256];
    uint64_t start = mono_ns();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], 0, worker, 0);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], 0);
    printf("secs %.6f\n", (mono_ns() - start) / 1e9);
    print_cpu();
    done();
    return 0;
}
