/* Built with -O2 -fomit-frame-pointer (see build.rs): a hot loop that runs inside a signal
 * handler, so its stacks reach `main` only through the signal frame (`__restore_rt`).
 *
 * `nofp_signal SECONDS`: `main` calls `wait_for_signals`, which spins; a SIGALRM every 10 ms
 * interrupts it and the handler calls `burn_in_handler` for a few milliseconds. Samples in
 * `burn_in_handler` must unwind as `main;wait_for_signals;__restore_rt;on_alarm;burn_in_handler`.
 * Neither loop reads the clock often, so few samples land in the vDSO.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long sink;
static volatile sig_atomic_t alarms;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Burns a few milliseconds of CPU. A stack buffer keeps rsp moving, so frame pointers cannot
 * recover the caller. */
__attribute__((noinline)) void burn_in_handler(void) {
    volatile char pad[64];
    unsigned long x = sink;
    for (unsigned long i = 0; i < 3000000; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        pad[i & 63] = (char)x;
    }
    sink = x + pad[3];
}

__attribute__((noinline)) void on_alarm(int sig) {
    (void)sig;
    alarms++;
    burn_in_handler();
    __asm__ volatile("" ::: "memory");
}

/* Spins until `deadline`; signals interrupt it here. */
__attribute__((noinline)) void wait_for_signals(double deadline) {
    volatile char pad[32];
    unsigned long x = 0;
    do {
        for (int i = 0; i < 1000000; i++) {
            x++;
            pad[x & 31] = (char)x;
        }
    } while (now() < deadline);
    sink += pad[1];
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 10000}, {0, 10000}};
    setitimer(ITIMER_REAL, &it, NULL);
    wait_for_signals(now() + seconds);
    return alarms > 0 ? 0 : 1;
}
