/* Two threads pass one byte back and forth over a pair of pipes: every round trip is two
 * blocking reads, so each thread switches out and in about once per round trip (the off-CPU
 * bench's context-switch-heavy workload, section 14). `pingpong ROUND_TRIPS` prints its wall
 * time (`secs S`) and the switches per second it reached (`switches_per_sec N`, both threads'
 * voluntary switches from getrusage over the wall time). */
#include "common.h"

#include <pthread.h>

static int ping[2], pong[2];
static long rounds;

__attribute__((noinline)) void wait_for_byte(int fd) {
    char c;
    if (read(fd, &c, 1) != 1)
        abort();
}

__attribute__((noinline)) void send_byte(int fd) {
    char c = 1;
    if (write(fd, &c, 1) != 1)
        abort();
}

__attribute__((noinline)) void *ponger(void *arg) {
    (void)arg;
    for (long i = 0; i < rounds; i++) {
        wait_for_byte(ping[0]);
        send_byte(pong[1]);
    }
    return NULL;
}

__attribute__((noinline)) void pinger(void) {
    for (long i = 0; i < rounds; i++) {
        send_byte(ping[1]);
        wait_for_byte(pong[0]);
    }
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 200000;
    if (pipe(ping) || pipe(pong))
        return 1;
    pthread_t t;
    uint64_t start = mono_ns();
    pthread_create(&t, NULL, ponger, NULL);
    pinger();
    pthread_join(t, NULL);
    double secs = (mono_ns() - start) / 1e9;
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("secs %.6f\n", secs);
    printf("switches_per_sec %.0f\n", (double)u.ru_nvcsw / secs);
    done();
    return 0;
}
