/*
 * fake/heaps.c: a `libjvm.so` whose VMStructs are plausible (every field bpfprof needs, at
 * small offsets) and whose code cache is a lie: 3.75 GiB of address space (just under the
 * 4 GiB bpfprof believes), eight code heaps each spanning all of it, the first 300 MiB full
 * of 16-byte blocks (length 1 segment, used), none of them a blob. Each scan of the cache
 * reads up to its 256 MiB bound; rescanned at every refresh, that took 3.3 s of bpfprof's CPU
 * in a 10 s run. For the hostile tests (issue 45).
 *
 * Built by the test: gcc -O0 -shared -fPIC -o DIR/libjvm.so heaps.c
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
struct entry { const char *type, *field, *type_string; int32_t is_static, pad; uint64_t offset; void *address; };
struct type_entry { const char *name; uint64_t size; };
struct int_entry { const char *name; int32_t value, pad; };
uint64_t gHotSpotVMStructEntryArrayStride = sizeof(struct entry);
uint64_t gHotSpotVMStructEntryTypeNameOffset = 0, gHotSpotVMStructEntryFieldNameOffset = 8,
 gHotSpotVMStructEntryTypeStringOffset = 16, gHotSpotVMStructEntryIsStaticOffset = 24,
 gHotSpotVMStructEntryOffsetOffset = 32, gHotSpotVMStructEntryAddressOffset = 40;
uint64_t gHotSpotVMTypeEntryArrayStride = sizeof(struct type_entry), gHotSpotVMTypeEntryTypeNameOffset = 0, gHotSpotVMTypeEntrySizeOffset = 8;
uint64_t gHotSpotVMIntConstantEntryArrayStride = sizeof(struct int_entry), gHotSpotVMIntConstantEntryNameOffset = 0, gHotSpotVMIntConstantEntryValueOffset = 8;
uint64_t gHotSpotVMLongConstantEntryArrayStride = 16;
void *gHotSpotVMLongConstants;
static uint64_t low_bound, high_bound;
struct garray { uint64_t pad; int32_t len, pad2; void **data; };
struct heap { uint64_t low, high; int32_t log2, pad; };
static struct heap heaps[8];
static void *heap_ptrs[8];
static struct garray arr = {0, 8, 0, heap_ptrs};
static struct garray *heaps_var = &arr;
#define F(t, f, ty, o) {t, f, ty, 0, 0, o, 0}
#define S(t, f, a) {t, f, "address", 1, 0, 0, (void *)(a)}
static struct entry structs[64] = {
 F("CodeBlob", "_code_offset", "int", 8), F("CodeBlob", "_data_offset", "int", 12),
 F("CodeBlob", "_name", "char*", 16), F("CodeBlob", "_frame_size", "int", 24),
 F("CodeBlob", "_frame_complete_offset", "int", 28),
 S("CodeCache", "_heaps", &heaps_var), S("CodeCache", "_low_bound", &low_bound), S("CodeCache", "_high_bound", &high_bound),
 F("GrowableArrayBase", "_len", "int", 8), F("GrowableArray<int>", "_data", "int*", 16),
 F("CodeHeap", "_memory", "VirtualSpace", 0), F("CodeHeap", "_log2_segment_size", "int", 16),
 F("VirtualSpace", "_low", "char*", 0), F("VirtualSpace", "_high", "char*", 8),
 F("HeapBlock::Header", "_length", "size_t", 0), F("HeapBlock::Header", "_used", "bool", 8),
 F("nmethod", "_method", "Method*", 32), F("nmethod", "_compile_id", "int", 40),
 F("nmethod", "_comp_level", "int", 44), F("nmethod", "_entry_bci", "int", 48),
 F("Method", "_constMethod", "ConstMethod*", 8), F("ConstMethod", "_constants", "ConstantPool*", 8),
 F("ConstMethod", "_name_index", "u2", 16), F("ConstantPool", "_pool_holder", "Klass*", 8),
 F("ConstantPool", "_length", "int", 16), F("Klass", "_name", "Symbol*", 8),
 F("Symbol", "_length", "u2", 4), F("Symbol", "_body", "u1", 6),
 {0}};
static struct type_entry types[] = {{"HeapBlock", 16}, {"ConstantPool", 64}, {"PcDesc", 16}, {0, 0}};
static struct int_entry ints[] = {{"frame::interpreter_frame_sender_sp_offset", -1}, {"frame::interpreter_frame_last_sp_offset", -2}, {0}};
struct entry *gHotSpotVMStructs = structs;
struct type_entry *gHotSpotVMTypes = types;
struct int_entry *gHotSpotVMIntConstants = ints;
/* What the program calls, so that it links and maps this library. */
void fake_jvm_linked(void) {}
#define SIZE 0xF0000000UL
#define FILLED (300UL << 20)
__attribute__((constructor)) static void fill(void) {
  char *r = mmap(0, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  uint64_t *w = (uint64_t *)r;
  for (uint64_t i = 0; i < FILLED / 8; i += 2) { w[i] = 1; w[i + 1] = 1; }
  low_bound = (uint64_t)r; high_bound = (uint64_t)r + SIZE;
  for (int i = 0; i < 8; i++) { heaps[i] = (struct heap){low_bound, high_bound, 4, 0}; heap_ptrs[i] = &heaps[i]; }
}
