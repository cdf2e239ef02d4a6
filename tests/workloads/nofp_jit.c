/* Built with -O2 -fomit-frame-pointer (see build.rs): stacks only unwind through CFI.
 *
 * `nofp_jit asm|jit SECONDS`: the hot leaf has neither CFI nor a frame pointer, as oneDNN's
 * JIT kernels and MKL's hand-written assembly in PyTorch: it saves rbp and rbx, keeps 64
 * bytes of locals, and counts its loop in rbp.
 *   asm: the leaf is `asm_burn`, assembly in this executable with no CFI directives (no FDE
 *        covers it), called from `asm_caller`.
 *   jit: the same machine code copied into an anonymous executable mapping (`[anon]`) and
 *        called from `jit_caller`.
 * A walk that takes rbp for a frame pointer there loses every frame above the leaf. The
 * leaf writes its locals before its loop, as JIT kernels write their spill slots: words left
 * on the stack by earlier calls are return addresses too, and a scan cannot tell them apart.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static volatile long sink;

/* push %rbp; push %rbx; sub $0x40,%rsp; zero the 8 local slots; mov %rdi,%rbp;
 * xor %ebx,%ebx; 1: mov %rbx,(%rsp); inc %rbx; dec %rbp; jne 1b; mov %rbx,%rax;
 * add $0x40,%rsp; pop %rbx; pop %rbp; ret */
#define LEAF_ASM                                                                          \
    "push %rbp\n push %rbx\n sub $0x40,%rsp\n xor %eax,%eax\n"                            \
    " mov %rax,(%rsp)\n mov %rax,0x8(%rsp)\n mov %rax,0x10(%rsp)\n mov %rax,0x18(%rsp)\n" \
    " mov %rax,0x20(%rsp)\n mov %rax,0x28(%rsp)\n mov %rax,0x30(%rsp)\n"                  \
    " mov %rax,0x38(%rsp)\n mov %rdi,%rbp\n xor %ebx,%ebx\n"                              \
    "1: mov %rbx,(%rsp)\n inc %rbx\n dec %rbp\n jne 1b\n mov %rbx,%rax\n"                 \
    " add $0x40,%rsp\n pop %rbx\n pop %rbp\n ret\n"

__asm__(".text\n.globl asm_burn\n.type asm_burn,@function\nasm_burn:\n" LEAF_ASM
        ".size asm_burn,.-asm_burn\n");
long asm_burn(long n);

/* The same code as bytes, for the JIT copy. */
static const unsigned char LEAF_CODE[] = {
    0x55,                                     /* push %rbp */
    0x53,                                     /* push %rbx */
    0x48, 0x83, 0xec, 0x40,                   /* sub $0x40,%rsp */
    0x31, 0xc0,                               /* xor %eax,%eax */
    0x48, 0x89, 0x04, 0x24,                   /* mov %rax,(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x08,             /* mov %rax,0x8(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x10,             /* mov %rax,0x10(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x18,             /* mov %rax,0x18(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x20,             /* mov %rax,0x20(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x28,             /* mov %rax,0x28(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x30,             /* mov %rax,0x30(%rsp) */
    0x48, 0x89, 0x44, 0x24, 0x38,             /* mov %rax,0x38(%rsp) */
    0x48, 0x89, 0xfd,                         /* mov %rdi,%rbp */
    0x31, 0xdb,                               /* xor %ebx,%ebx */
    0x48, 0x89, 0x1c, 0x24,                   /* 1: mov %rbx,(%rsp) */
    0x48, 0xff, 0xc3,                         /* inc %rbx */
    0x48, 0xff, 0xcd,                         /* dec %rbp */
    0x75, 0xf4,                               /* jne 1b */
    0x48, 0x89, 0xd8,                         /* mov %rbx,%rax */
    0x48, 0x83, 0xc4, 0x40,                   /* add $0x40,%rsp */
    0x5b,                                     /* pop %rbx */
    0x5d,                                     /* pop %rbp */
    0xc3,                                     /* ret */
};

typedef long (*leaf_fn)(long);

__attribute__((noinline)) long asm_caller(long n) {
    long r = asm_burn(n);
    sink += r; /* not a tail call: the caller's frame stays */
    return r;
}

__attribute__((noinline)) long jit_caller(leaf_fn leaf, long n) {
    long r = leaf(n);
    sink += r;
    return r;
}

static double elapsed(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec - start->tv_sec + (now.tv_nsec - start->tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "asm") && strcmp(argv[1], "jit"))) {
        fprintf(stderr, "usage: nofp_jit asm|jit [SECONDS]\n");
        return 2;
    }
    int jit = !strcmp(argv[1], "jit");
    double seconds = argc > 2 ? atof(argv[2]) : 10;
    leaf_fn leaf = NULL;
    if (jit) {
        void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memcpy(page, LEAF_CODE, sizeof LEAF_CODE);
        if (mprotect(page, 4096, PROT_READ | PROT_EXEC)) {
            perror("mprotect");
            return 1;
        }
        leaf = (leaf_fn)page;
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (int i = 0; i < 100; i++) {
            if (jit)
                jit_caller(leaf, 200000);
            else
                asm_caller(200000);
        }
    } while (elapsed(&start) < seconds);
    return 0;
}
