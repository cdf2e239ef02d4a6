/* A shared library built without frame pointers (see build.rs), loaded by nofp_dlopen with
 * dlopen after the profile started. */

static volatile unsigned long lib_sink;

/* The hot leaf; its stack buffer moves rsp, so only CFI finds its caller. */
__attribute__((noinline)) void lib_burn(unsigned long n) {
    volatile char pad[64];
    unsigned long x = lib_sink;
    for (unsigned long i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        pad[i & 63] = (char)x;
    }
    lib_sink = x + pad[5];
}

/* The library's own caller of the leaf, so a whole path through the library is checked. */
__attribute__((noinline)) void lib_work(unsigned long n) {
    volatile char pad[32];
    pad[n & 31] = 1;
    lib_burn(n);
    lib_sink += pad[3];
}
