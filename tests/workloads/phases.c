// A program in two phases, for timelines: `phases SECONDS` starts a thread named `phaser` that
// burns SECONDS of its own CPU time in phase_a (leaf function a), then SECONDS in phase_b
// (leaf function b), and exits when it is done. CPU time, not wall time, bounds each phase,
// so that on a loaded machine both phases still get about as many samples.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static double phase_secs;
static volatile uint64_t sink;

static double thread_cpu_secs(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void a(double until) {
    while (thread_cpu_secs() < until) {
        for (int i = 0; i < 100000; i++) {
            sink += (uint64_t)i * 7;
        }
    }
}

__attribute__((noinline)) void b(double until) {
    while (thread_cpu_secs() < until) {
        for (int i = 0; i < 100000; i++) {
            sink ^= (uint64_t)i * 13;
        }
    }
}

__attribute__((noinline)) void phase_a(void) { a(thread_cpu_secs() + phase_secs); }

__attribute__((noinline)) void phase_b(void) { b(thread_cpu_secs() + phase_secs); }

static void *phaser(void *arg) {
    (void)arg;
    phase_a();
    phase_b();
    return NULL;
}

int main(int argc, char **argv) {
    phase_secs = argc > 1 ? atof(argv[1]) : 1.0;
    pthread_t t;
    pthread_create(&t, NULL, phaser, NULL);
    pthread_setname_np(t, "phaser");
    pthread_join(t, NULL);
    return 0;
}
