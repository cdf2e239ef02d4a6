/* Built with -O2 -fomit-frame-pointer (see build.rs): a loop whose time goes to the dynamic
 * linker (ld.so, the highest executable mapping of the process), which looks symbols up for
 * `dlsym`. Every sample there must unwind through ld.so's CFI back to `main`.
 *
 * `nofp_dlsym SECONDS`
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) void look_up_symbols(void) {
    static const char *names[] = {"printf", "malloc", "no_such_symbol_here", "qsort", "strtod"};
    for (int i = 0; i < 2000; i++) {
        sink += (unsigned long)dlsym(RTLD_DEFAULT, names[i % 5]);
    }
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        look_up_symbols();
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
