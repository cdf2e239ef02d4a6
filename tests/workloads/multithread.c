/*
 * multithread: two worker threads that burn CPU in thread_a_work and
 * thread_b_work while the main thread just waits.  A profiler that samples
 * the whole process (all threads) sees both functions.
 *
 * Usage: multithread [SECONDS]   (default: run forever)
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void thread_a_work(void)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 200000UL; i++)
        acc += i;
    sink = acc;
}

__attribute__((noinline)) void thread_b_work(void)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 200000UL; i++)
        acc ^= i;
    sink = acc;
}

static void *run_a(void *arg)
{
    (void)arg;
    for (;;)
        thread_a_work();
    return NULL;
}

static void *run_b(void *arg)
{
    (void)arg;
    for (;;)
        thread_b_work();
    return NULL;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.0;
    pthread_t a, b;
    if (pthread_create(&a, NULL, run_a, NULL) || pthread_create(&b, NULL, run_b, NULL))
        return 1;
    if (secs > 0) {
        usleep((useconds_t)(secs * 1e6));
        return 0;
    }
    pthread_join(a, NULL);
    return 0;
}
