// Worker threads that compute, sleep and block on a pipe in known functions, and measure their
// own split: `offcpu SECONDS [WORKERS [NAME]]` runs for SECONDS, then prints the wall time its
// workers (threads named NAME, default `worker`, so that a tracer can pick them by name) spent in
// each phase, summed over them: `compute_ns=N sleep_ns=N pipe_ns=N`.
//
// Each round: compute_phase burns 5 ms of the thread's CPU time, sleep_phase sleeps 3 ms
// (nanosleep), pipe_phase asks the worker's feeder thread for a byte and blocks in read() until
// it comes 2 ms later: 50% / 30% / 20% of an unloaded machine's wall time. Compute is measured
// by wall clock, so on a loaded machine its share grows by the time it waited for a CPU.
// The waits are raw system calls made in those functions: libc's wrappers have no frame
// pointer, and a frame-pointer walk from inside one skips its caller.
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/syscall.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double run_secs;
static const char *worker_name = "worker";
static volatile uint64_t sink;

struct worker {
    int request[2];
    int reply[2];
    uint64_t compute_ns, sleep_ns, pipe_ns;
};

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline long raw_syscall3(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
}

static inline void nap(long ns) {
    struct timespec ts = {0, ns};
    while (raw_syscall3(SYS_nanosleep, (long)&ts, (long)&ts, 0) != 0) {
    }
}

__attribute__((noinline)) void compute_phase(void) {
    uint64_t until = now_ns(CLOCK_THREAD_CPUTIME_ID) + 5000000;
    uint64_t x = 1;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) < until) {
        for (int i = 0; i < 1000; i++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
        }
    }
    sink = x;
}

__attribute__((noinline)) void sleep_phase(void) { nap(3000000); }

__attribute__((noinline)) void pipe_phase(struct worker *w) {
    char c = 1;
    if (raw_syscall3(SYS_write, w->request[1], (long)&c, 1) != 1 ||
        raw_syscall3(SYS_read, w->reply[0], (long)&c, 1) != 1) {
        abort();
    }
}

__attribute__((noinline)) void *feeder(void *arg) {
    struct worker *w = arg;
    char c;
    pthread_setname_np(pthread_self(), "feeder");
    while (read(w->request[0], &c, 1) == 1) {
        nap(2000000);
        if (write(w->reply[1], &c, 1) != 1) {
            break;
        }
    }
    return NULL;
}

__attribute__((noinline)) void *worker(void *arg) {
    struct worker *w = arg;
    pthread_setname_np(pthread_self(), worker_name);
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(run_secs * 1e9);
    while (now_ns(CLOCK_MONOTONIC) < end) {
        uint64_t t0 = now_ns(CLOCK_MONOTONIC);
        compute_phase();
        uint64_t t1 = now_ns(CLOCK_MONOTONIC);
        sleep_phase();
        uint64_t t2 = now_ns(CLOCK_MONOTONIC);
        pipe_phase(w);
        uint64_t t3 = now_ns(CLOCK_MONOTONIC);
        w->compute_ns += t1 - t0;
        w->sleep_ns += t2 - t1;
        w->pipe_ns += t3 - t2;
    }
    return NULL;
}

int main(int argc, char **argv) {
    run_secs = argc > 1 ? atof(argv[1]) : 3.0;
    int n = argc > 2 ? atoi(argv[2]) : 2;
    if (argc > 3) {
        worker_name = argv[3];
    }
    struct worker *workers = calloc(n, sizeof *workers);
    pthread_t *threads = calloc(2 * n, sizeof *threads);
    for (int i = 0; i < n; i++) {
        if (pipe(workers[i].request) || pipe(workers[i].reply)) {
            return 1;
        }
        pthread_create(&threads[2 * i], NULL, feeder, &workers[i]);
        pthread_create(&threads[2 * i + 1], NULL, worker, &workers[i]);
    }
    uint64_t compute = 0, sleep = 0, piped = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(threads[2 * i + 1], NULL);
        close(workers[i].request[1]);
        pthread_join(threads[2 * i], NULL);
        compute += workers[i].compute_ns;
        sleep += workers[i].sleep_ns;
        piped += workers[i].pipe_ns;
    }
    printf("compute_ns=%llu sleep_ns=%llu pipe_ns=%llu\n", (unsigned long long)compute,
           (unsigned long long)sleep, (unsigned long long)piped);
    return 0;
}
