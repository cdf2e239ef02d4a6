/* Built with -O2 -fomit-frame-pointer (see build.rs): stacks only unwind through CFI.
 *
 * `nofp parents SECONDS`: a hot leaf `burn` called from two parents, `parent_a` with 3 units
 * of work per round and `parent_b` with 1, so about 75% / 25% of the leaf's samples.
 * `nofp recurse SECONDS [DEPTH]`: `recurse` calls itself DEPTH (default 100) deep, then `burn`
 * spins at the bottom.
 * `nofp vdso SECONDS`: `clock_a` (3 units) and `clock_b` (1 unit) call `clock_gettime`,
 * which runs in the vDSO.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

/* The hot leaf: its callers are what the test checks. A stack buffer forces a frame that
 * moves rsp, so a frame-pointer walk cannot recover the caller. */
__attribute__((noinline)) void burn(unsigned long n) {
    volatile char pad[64];
    unsigned long x = sink;
    for (unsigned long i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        pad[i & 63] = (char)x;
    }
    sink = x + pad[5];
}

__attribute__((noinline)) void parent_a(void) {
    burn(3000000);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void parent_b(void) {
    burn(1000000);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) int recurse(int depth, unsigned long n) {
    volatile char pad[32];
    pad[depth & 31] = (char)depth;
    if (depth == 0) {
        burn(n);
        return pad[0];
    }
    int r = recurse(depth - 1, n) + pad[depth & 31];
    __asm__ volatile("" ::: "memory");
    return r;
}

__attribute__((noinline)) void clock_loop(unsigned long n) {
    struct timespec ts;
    unsigned long total = sink;
    for (unsigned long i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        total += (unsigned long)ts.tv_nsec;
    }
    sink = total;
}

__attribute__((noinline)) void clock_a(void) {
    clock_loop(30000);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void clock_b(void) {
    clock_loop(10000);
    __asm__ volatile("" ::: "memory");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: nofp parents|recurse|vdso SECONDS [DEPTH]\n");
        return 2;
    }
    double end = now() + atof(argv[2]);
    int rounds = 0;
    while (now() < end) {
        if (strcmp(argv[1], "parents") == 0) {
            parent_a();
            parent_b();
        } else if (strcmp(argv[1], "vdso") == 0) {
            clock_a();
            clock_b();
        } else {
            sink += recurse(argc > 3 ? atoi(argv[3]) : 100, 1000000);
        }
        rounds++;
    }
    printf("%d rounds\n", rounds);
    return 0;
}
