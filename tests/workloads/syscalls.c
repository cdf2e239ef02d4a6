/*
 * syscalls: spends most of its time in the kernel so that samples carry
 * kernel frames.  Reads big buffers from /dev/zero (kernel clears user
 * memory) and issues cheap getppid syscalls, all from do_syscalls().
 *
 * On x86_64 the syscall instruction is issued inline from do_syscalls, so
 * the user part of each stack is main -> do_syscalls even with a
 * frame-pointer unwinder (libc's read() wrapper sets up no frame, which
 * would hide its caller).
 *
 * Usage: syscalls [SECONDS]   (default: run forever)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 20];

static inline __attribute__((always_inline)) long raw_syscall3(long nr, long a, long b, long c)
{
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
#else
    return syscall(nr, a, b, c);
#endif
}

__attribute__((noinline)) void do_syscalls(int fd)
{
    for (int i = 0; i < 16; i++) {
        if (raw_syscall3(SYS_read, fd, (long)buf, sizeof(buf)) < 0)
            exit(1);
        raw_syscall3(SYS_getppid, 0, 0, 0);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.0;
    double end = now() + secs;
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0)
        return 1;
    for (;;) {
        do_syscalls(fd);
        if (secs > 0 && now() >= end)
            break;
    }
    return 0;
}
