/*
 * fake/libjvm.c: a `libjvm.so` that is no JVM, for the hostile tests (issue 45). bpfprof takes a
 * process that maps a file of this name for HotSpot and reads the `gHotSpotVM*` tables it
 * exports (the serviceability agent's VMStructs); these say nonsense:
 *
 *   gHotSpotVMStructs       30,000 entries with no terminating entry (each type and field name
 *                           255 characters, all different), past bpfprof's bound of 20,000
 *   gHotSpotVMTypes         a short table whose sizes are 2**63
 *   gHotSpotVMIntConstants  a table whose every entry names itself (its name pointer points at
 *                           the entry) and that never ends
 *   gHotSpotVMLongConstants an unmapped address
 *
 * No field bpfprof needs is there: the run must refuse this process in words, in bounded
 * time and memory, and profile everything else as before.
 *
 * Built by the test: gcc -O0 -shared -fPIC -o DIR/libjvm.so libjvm.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRUCTS 30000
#define NAME 256

struct entry {
    const char *type;
    const char *field;
    const char *type_string;
    int32_t is_static;
    int32_t pad;
    uint64_t offset;
    void *address;
};

struct type_entry {
    const char *name;
    uint64_t size;
};

struct int_entry {
    const char *name;
    int32_t value;
    int32_t pad;
};

uint64_t gHotSpotVMStructEntryArrayStride = sizeof(struct entry);
uint64_t gHotSpotVMStructEntryTypeNameOffset = 0;
uint64_t gHotSpotVMStructEntryFieldNameOffset = 8;
uint64_t gHotSpotVMStructEntryTypeStringOffset = 16;
uint64_t gHotSpotVMStructEntryIsStaticOffset = 24;
uint64_t gHotSpotVMStructEntryOffsetOffset = 32;
uint64_t gHotSpotVMStructEntryAddressOffset = 40;
struct entry *gHotSpotVMStructs;

uint64_t gHotSpotVMTypeEntryArrayStride = sizeof(struct type_entry);
uint64_t gHotSpotVMTypeEntryTypeNameOffset = 0;
uint64_t gHotSpotVMTypeEntrySizeOffset = 8;
static struct type_entry types[4] = {
    {"CodeCache", 1ULL << 63}, {"CodeHeap", 1ULL << 63}, {"Method", 1ULL << 63}, {0, 0}};
struct type_entry *gHotSpotVMTypes = types;

uint64_t gHotSpotVMIntConstantEntryArrayStride = sizeof(struct int_entry);
uint64_t gHotSpotVMIntConstantEntryNameOffset = 0;
uint64_t gHotSpotVMIntConstantEntryValueOffset = 8;
struct int_entry *gHotSpotVMIntConstants;

uint64_t gHotSpotVMLongConstantEntryArrayStride = 16;
void *gHotSpotVMLongConstants = (void *)0x7ff0dead0000ULL;

/* What the program calls, so that it links and maps this library (a use of a table instead
 * would copy it into the program, leaving this library's own copy unfilled). */
void fake_jvm_linked(void) {}

__attribute__((constructor)) static void fill(void)
{
    static char names[2][STRUCTS][NAME];
    static struct entry structs[STRUCTS];
    static struct int_entry ints[STRUCTS];
    for (int i = 0; i < STRUCTS; i++) {
        memset(names[0][i], 'T', NAME - 1);
        memset(names[1][i], 'f', NAME - 1);
        snprintf(names[0][i], 16, "T%d", i);
        snprintf(names[1][i], 16, "f%d", i);
        names[0][i][strlen(names[0][i])] = 'T';
        names[1][i][strlen(names[1][i])] = 'f';
        structs[i] = (struct entry){names[0][i], names[1][i], "uint64_t", 0, 0, (uint64_t)-1,
                                    (void *)-1};
        ints[i].name = (const char *)&ints[i];
        ints[i].value = -1;
    }
    gHotSpotVMStructs = structs;
    gHotSpotVMIntConstants = ints;
}
