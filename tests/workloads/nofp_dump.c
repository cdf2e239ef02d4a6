/*
 * nofp_dump: threads in known places, for `bpfprof dump`. Built without frame pointers
 * (-O2 -fomit-frame-pointer), as distributions build: the stacks unwind only by CFI.
 *
 * - "spinner" burns the CPU in spin_leaf, called by spin_loop;
 * - "reader" blocks in read() of a pipe nobody writes to, called by wait_for_input;
 * - the main thread waits in pthread_join.
 *
 * Usage: nofp_dump [SECONDS]   (default: run until killed)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void spin_leaf(void)
{
    for (unsigned long i = 0; i < 1000000UL; i++)
        sink += i;
}

__attribute__((noinline)) void spin_loop(void)
{
    for (;;) {
        spin_leaf();
        __asm__ volatile("" ::: "memory");
    }
}

static void *spinner(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "spinner");
    spin_loop();
    return NULL;
}

__attribute__((noinline)) int wait_for_input(int fd)
{
    char c = 0;
    /* Nobody writes: read() blocks until the process ends. */
    if (read(fd, &c, 1) < 0)
        return -1;
    sink += (unsigned char)c;
    return 0;
}

static int fds[2];

static void *reader(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    wait_for_input(fds[0]);
    return NULL;
}

static void *timer(void *arg)
{
    sleep((unsigned)(long)arg);
    exit(0);
}

int main(int argc, char **argv)
{
    long secs = argc > 1 ? atol(argv[1]) : 0;
    pthread_t s, r, t;
    if (pipe(fds))
        return 1;
    if (pthread_create(&s, NULL, spinner, NULL) || pthread_create(&r, NULL, reader, NULL))
        return 1;
    if (secs > 0 && pthread_create(&t, NULL, timer, (void *)secs))
        return 1;
    pthread_join(s, NULL);
    return 0;
}
