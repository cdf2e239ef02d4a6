/* Built with -O2 -fomit-frame-pointer (see build.rs).
 *
 * `nofp_dlopen LIBRARY SECONDS`: sleeps 1 s (the profile starts meanwhile), dlopens LIBRARY
 * (libhot.so), sleeps 1 s more (bpfprof reads new mappings every 0.5 s), then calls its
 * `lib_work` from `call_lib` for SECONDS.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void call_lib(void (*work)(unsigned long)) {
    volatile char pad[48];
    pad[sink & 47] = 1;
    work(1000000);
    sink += pad[7];
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: nofp_dlopen LIBRARY SECONDS\n");
        return 2;
    }
    sleep(1);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    void (*work)(unsigned long) = (void (*)(unsigned long))dlsym(lib, "lib_work");
    if (!work) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    sleep(1);
    double end = now() + atof(argv[2]);
    while (now() < end)
        call_lib(work);
    return 0;
}
