/*
 * A fake Node.js for the hostile tests (issue 45): it exports V8 13.6's postmortem constants
 * (`v8dbg_*`, the values of Debian sid's Node 24, all believed) and runs one "JavaScript frame"
 * in anonymous executable memory, in a forged TurboFan Code object whose tables attack the
 * reading of inlined functions: its inlining positions say the inlined call's caller is the
 * call itself (a chain with no end), and the position table's entry points at it. Built as
 * `node-inline-fake` (named like Node.js, with -rdynamic so that the constants are exported).
 *
 * The frame: code that pushes a frame pointer, the context and the JSFunction slots below
 * it (as V8's JavaScript frames have them) and spins. Its function is a SharedFunctionInfo
 * named `fakeInlined`; bpfprof should show that one frame, once per stack, and cost its usual.
 *
 * Usage: node-inline-fake SECONDS
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define C(name, value) __attribute__((used)) int v8dbg_##name = value;
C(CodeKindBaseline, 10)
C(CodeKindFieldMask, 15)
C(CodeKindFieldShift, 0)
C(CodeKindInterpretedFunction, 9)
C(ConsStringTag, 1)
C(DeoptimizationDataInlinedFunctionCountIndex, 1)
C(DeoptimizationDataInliningPositionsIndex, 8)
C(DeoptimizationDataLiteralArrayIndex, 3)
C(FirstJSFunctionType, 2065)
C(FirstNonstringType, 128)
C(LastJSFunctionType, 2081)
C(OneByteStringTag, 8)
C(SeqStringTag, 0)
C(SlicedStringTag, 3)
C(SmiShiftSize, 31)
C(StringEncodingMask, 8)
C(StringRepresentationMask, 7)
C(SystemPointerSize, 8)
C(ThinStringTag, 5)
C(class_Code__flags__uint32_t, 52)
C(class_Code__instruction_size__int, 56)
C(class_Code__instruction_start__Address, 40)
C(class_Code__instruction_stream__Tagged_InstructionStream_, 32)
C(class_ConsString__first__String, 16)
C(class_ConsString__second__String, 24)
C(class_FixedArrayBase__length__SMI, 8)
C(class_FixedArray__data__uintptr_t, 16)
C(class_HeapObject__map__Map, 0)
C(class_InstructionStream__instruction_start__uintptr_t, 32)
C(class_JSFunction__shared__SharedFunctionInfo, 32)
C(class_Map__instance_type__uint16_t, 12)
C(class_Script__line_ends__Object, 56)
C(class_Script__name__Object, 16)
C(class_Script__source__Object, 8)
C(class_SeqOneByteString__chars__char, 16)
C(class_SeqTwoByteString__chars__char, 16)
C(class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_, 24)
C(class_SharedFunctionInfo__script__Tagged_HeapObject_, 40)
C(class_SlicedString__offset__SMI, 24)
C(class_SlicedString__parent__String, 16)
C(class_String__length__int32_t, 12)
C(class_ThinString__actual__String, 16)
C(off_fp_bytecode_offset, -40)
C(off_fp_context_or_frame_type, -8)
C(off_fp_function, -16)
C(scopeinfo_idx_first_vars, 5)
C(scopeinfo_idx_ncontextlocals, 2)
C(type_CodeWrapper__CODE_WRAPPER_TYPE, 153)
C(type_Code__CODE_TYPE, 187)
C(type_FixedArray__FIXED_ARRAY_TYPE, 205)
C(type_InstructionStream__INSTRUCTION_STREAM_TYPE, 192)
C(type_JSFunction__JS_FUNCTION_TYPE, 2065)
C(type_ScopeInfo__SCOPE_INFO_TYPE, 280)
C(type_Script__SCRIPT_TYPE, 167)
C(type_SharedFunctionInfoWrapper__SHARED_FUNCTION_INFO_WRAPPER_TYPE, 195)
C(type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE, 282)
C(type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE, 196)
C(type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE, 193)
C(type_ByteArray__BYTE_ARRAY_TYPE, 217)
int _ZN2v88internal7Version6major_E = 13;
int _ZN2v88internal7Version6minor_E = 6;
int _ZN2v88internal7Version6build_E = 233;

/* The fake heap: 8-aligned words; an object's tagged pointer is its address plus 1. */
static uint64_t heap[1 << 14];
static size_t used;

static uint64_t *alloc(size_t words)
{
    uint64_t *at = &heap[used];
    used += words;
    return at;
}

static uint64_t tagged(uint64_t *object) { return (uint64_t)object + 1; }
static uint64_t smi(int64_t value) { return (uint64_t)value << 32; }

/* A map whose objects have instance type `type` (at Map::instance_type, offset 12). */
static uint64_t map_of(uint16_t type)
{
    uint64_t *map = alloc(4);
    memcpy((char *)map + 12, &type, 2);
    return tagged(map);
}

/* A byte array (`type`) holding `bytes`. */
static uint64_t byte_array(uint16_t type, const uint8_t *bytes, size_t n)
{
    uint64_t *array = alloc(2 + (n + 7) / 8);
    array[0] = map_of(type);
    array[1] = smi((int64_t)n);
    memcpy(&array[2], bytes, n);
    return tagged(array);
}

/* Appends `value` zigzag- and LEB128-encoded, as V8's source position tables have it. */
static size_t put_number(uint8_t *out, int64_t value)
{
    uint64_t encoded = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    size_t n = 0;
    do {
        uint8_t byte = encoded & 0x7f;
        encoded >>= 7;
        out[n++] = byte | (encoded ? 0x80 : 0);
    } while (encoded);
    return n;
}

int main(int argc, char **argv)
{
    unsigned seconds = argc > 1 ? (unsigned)atoi(argv[1]) : 60;
    /* The function's name, a sequential one-byte string (type 8). */
    const char *name = "fakeInlined";
    uint64_t *string = alloc(2 + 2);
    string[0] = map_of(8);
    uint32_t length = (uint32_t)strlen(name);
    memcpy((char *)string + 12, &length, 4);
    memcpy((char *)string + 16, name, length);
    uint64_t *shared = alloc(8);
    shared[0] = map_of(282);
    shared[3] = tagged(string); /* name_or_scope_info */
    shared[5] = smi(0);         /* no script */
    uint64_t *function = alloc(8);
    function[0] = map_of(2065);
    function[4] = tagged(shared);
    uint64_t *context = alloc(2);
    context[0] = map_of(1);

    /* The code: an InstructionStream header (its map, its Code) and, 32 bytes on, the
     * instructions, in anonymous executable memory as V8's are. */
    uint8_t *region = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE | PROT_EXEC,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return 1;
    uint64_t *stream = (uint64_t *)(region + 0x1000);
    uint8_t *code_start = region + 0x1000 + 32;
    uint64_t *code = alloc(8);
    stream[0] = map_of(192);
    stream[1] = tagged(code);
    uint8_t *p = code_start;
    /* push rbp; mov rbp, rsp; mov rax, CONTEXT; push rax; mov rax, FUNCTION; push rax;
     * sub rsp, 48 (the rest of the slots bpfprof reads); then spin: jmp . */
    *p++ = 0x55;
    *p++ = 0x48; *p++ = 0x89; *p++ = 0xe5;
    *p++ = 0x48; *p++ = 0xb8;
    uint64_t word = tagged(context);
    memcpy(p, &word, 8); p += 8;
    *p++ = 0x50;
    *p++ = 0x48; *p++ = 0xb8;
    word = tagged(function);
    memcpy(p, &word, 8); p += 8;
    *p++ = 0x50;
    *p++ = 0x48; *p++ = 0x83; *p++ = 0xec; *p++ = 0x30;
    *p++ = 0xeb; *p++ = 0xfe;
    uint32_t size = (uint32_t)(p - code_start);

    /* One position for the whole code: script offset 5 in inlined call 1. */
    uint8_t table[32];
    size_t n = put_number(table, 1); /* code offset -1 + 1 = 0, a statement */
    uint64_t position = ((uint64_t)(5 + 1) << 1) | ((uint64_t)1 << 31);
    n += put_number(table + n, (int64_t)position);
    /* Inlining position 1: called from a position in inlined call 1 itself, function 0. */
    uint8_t inlining[16] = {0};
    memcpy(inlining, &position, 8);
    uint64_t *literals = alloc(3);
    literals[0] = map_of(205);
    literals[1] = smi(1);
    literals[2] = tagged(shared);
    uint64_t *deopt = alloc(2 + 9);
    deopt[0] = map_of(193);
    deopt[1] = smi(9);
    deopt[2 + 1] = smi(1);              /* inlined function count */
    deopt[2 + 3] = tagged(literals);    /* literal array */
    deopt[2 + 8] = byte_array(196, inlining, sizeof inlining);
    code[0] = map_of(187);
    code[1] = tagged(deopt);                  /* deoptimization data */
    code[2] = byte_array(196, table, n);      /* source position table */
    code[4] = tagged(stream);                 /* instruction stream */
    code[5] = (uint64_t)code_start;           /* instruction start */
    uint32_t flags = 12;                      /* TURBOFAN_JS */
    memcpy((char *)code + 52, &flags, 4);
    memcpy((char *)code + 56, &size, 4);

    /* The test kills it; it also ends by itself. */
    alarm(seconds);
    ((void (*)(void))code_start)();
    return 0;
}
