/*
 * fake/runtime.c: spins in `fake_runtime_spin` (a known function) for SECONDS, linked with the
 * fake `libjvm.so` of libjvm.c (built with -DJVM) or exporting V8's postmortem constants
 * with wild values (-DV8, the binary then named like Node.js, `node-fake`): what bpfprof reads
 * to take a process for a JVM or for Node.js, faked, for the hostile tests (issue 45).
 *
 * The V8 constants: every frame slot, field offset and type tag out of range or nonsense
 * (negative, past 2**31, a slot not a multiple of 8), a V8 version and a 64-bit pointer size
 * so that the constants are believed to be V8's and each is checked.
 *
 * Usage: fake_runtime SECONDS
 */
#include <stdlib.h>
#include <time.h>

#ifdef JVM
extern void fake_jvm_linked(void);
#endif

#ifdef V8
#define C(name, value) __attribute__((used)) int v8dbg_##name = value;
C(SystemPointerSize, 8)
C(SmiShiftSize, 31)
C(off_fp_function, -12345)
C(off_fp_context_or_frame_type, 8)
C(off_fp_bytecode_offset, -2147483647)
C(class_JSFunction__shared__SharedFunctionInfo, 2147483647)
C(class_JSFunction__code__Code, -8)
C(FirstJSFunctionType, 70000)
C(LastJSFunctionType, 3)
C(type_JSFunction__JS_FUNCTION_TYPE, -1)
C(class_HeapObject__map__Map, -1)
C(class_Map__instance_type__uint16_t, 1 << 30)
C(class_Script__name__Object, 1 << 30)
C(class_String__length__int32_t, -4)
int _ZN2v88internal7Version6major_E = 12;
int _ZN2v88internal7Version6minor_E = 4;
int _ZN2v88internal7Version6build_E = 254;
#endif

volatile unsigned long sink;

__attribute__((noinline)) void fake_runtime_spin(time_t end)
{
    while (time(NULL) < end) {
        volatile unsigned long acc = 0;
        for (unsigned long i = 0; i < 1000000UL; i++)
            acc += i;
        sink = acc;
    }
}

int main(int argc, char **argv)
{
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 60);
#ifdef JVM
    /* A call into the library, so that it is linked and mapped. */
    fake_jvm_linked();
#endif
    fake_runtime_spin(end);
    return 0;
}
