/* Built with -O2 -fomit-frame-pointer (see build.rs): stacks only unwind through CFI.
 *
 * `nofp_realign SECONDS`: the hot leaf `burn` is called from `vector_step`, which keeps AVX
 * values live across the call, from `realigned_driver`, which keeps them across its loop: gcc
 * realigns the driver's stack to 32 bytes with a DRAP register, and its CFI then says
 * CFA = *(rbp - 8) (`DW_CFA_def_cfa_expression`), as in many of PyTorch's AVX kernels. A walk
 * that does not read that rule loses every caller above the driver.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <time.h>

static volatile long sink;

__attribute__((noinline)) long burn(long n) {
    long s = sink;
    for (long i = 0; i < n; i++)
        s = s * 6364136223846793005L + 1442695040888963407L;
    sink = s;
    return s;
}

__attribute__((noinline, target("avx2"))) __m256 vector_step(__m256 a, __m256 b, long n) {
    __m256 x = _mm256_add_ps(a, b), y = _mm256_mul_ps(a, b), z = _mm256_sub_ps(a, b);
    burn(n);
    return _mm256_add_ps(_mm256_add_ps(x, y), z);
}

__attribute__((noinline, target("avx2"))) float realigned_driver(long rounds) {
    __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.5f);
    for (long r = 0; r < rounds; r++) {
        a = vector_step(a, b, 200000);
        b = _mm256_mul_ps(b, _mm256_set1_ps(0.999f));
    }
    return a[0] + b[1];
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        sink = (long)realigned_driver(100);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
