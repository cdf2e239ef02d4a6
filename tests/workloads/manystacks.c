/*
 * manystacks: two threads walk random paths through a binary tree of calls,
 * 16 levels deep with two functions per level (left_K, right_K), so there are
 * 65536 distinct stacks and a few seconds of sampling meets tens of thousands
 * of them. Every path ends in the leaf burn().
 *
 * Usage: manystacks [SECONDS]   (default: run forever)
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void burn(void)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 20000UL; i++)
        acc += i;
    sink = acc;
}

/* Level K picks level K+1's left or right function by bit K of the path. */
#define LEVEL(K, NEXT_LEFT, NEXT_RIGHT)                                        \
    __attribute__((noinline)) void left_##K(unsigned path)                     \
    {                                                                          \
        if (path & (1u << K)) NEXT_RIGHT(path); else NEXT_LEFT(path);          \
        sink++;                                                                \
    }                                                                          \
    __attribute__((noinline)) void right_##K(unsigned path)                    \
    {                                                                          \
        if (path & (1u << K)) NEXT_RIGHT(path); else NEXT_LEFT(path);          \
        sink++;                                                                \
    }

static void leaf(unsigned path) { (void)path; burn(); }
LEVEL(15, leaf, leaf)
LEVEL(14, left_15, right_15)
LEVEL(13, left_14, right_14)
LEVEL(12, left_13, right_13)
LEVEL(11, left_12, right_12)
LEVEL(10, left_11, right_11)
LEVEL(9, left_10, right_10)
LEVEL(8, left_9, right_9)
LEVEL(7, left_8, right_8)
LEVEL(6, left_7, right_7)
LEVEL(5, left_6, right_6)
LEVEL(4, left_5, right_5)
LEVEL(3, left_4, right_4)
LEVEL(2, left_3, right_3)
LEVEL(1, left_2, right_2)
LEVEL(0, left_1, right_1)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double end;

static void *walk(void *arg)
{
    unsigned seed = (unsigned)(unsigned long)arg;
    while (end == 0 || now() < end) {
        unsigned path = (unsigned)rand_r(&seed);
        if (path & (1u << 16))
            right_0(path);
        else
            left_0(path);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.0;
    end = secs > 0 ? now() + secs : 0;
    pthread_t t;
    pthread_create(&t, NULL, walk, (void *)1UL);
    walk((void *)2UL);
    pthread_join(t, NULL);
    return 0;
}
