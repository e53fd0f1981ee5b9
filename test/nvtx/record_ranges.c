/* An NVTX injection library, loaded the way Nsight Systems and Nsight Compute load
 * theirs: the NVTX library (libnvToolsExt.so.1) dlopens the file NVTX_INJECTION64_PATH
 * names at the first NVTX call and calls its InitializeInjectionNvtx2, which replaces the
 * core functions it handles in NVTX's function table. This one appends each range event
 * to the file VP_NVTX_RECORD names, one line each (tid: the OS thread id):
 *
 *   init <tid>
 *   push <tid> <name>        pop <tid>
 *   start <id> <tid> <name>  end <id> <tid>
 *
 * test/nvtx.rs compiles it (cc -shared -fPIC) and reads the file. The declarations are
 * the few this file needs from the NVTX 3 headers' ABI (nvtx3/nvtxDetail/nvtxTypes.h of
 * the nvidia-nvtx-cu12 wheel that scripts/setup/requirements/common.txt pins: the export table,
 * the CORE module and its callback ids, which NVTX never renumbers). */

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* nvtxTypes.h: NvtxFunctionPointer, NvtxFunctionTable, NvtxGetExportTableFunc_t,
 * NvtxExportTableCallbacks. */
typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);
typedef struct NvtxExportTableCallbacks {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table,
                                  unsigned int *out_size);
} NvtxExportTableCallbacks;

/* NvtxExportTableID, NvtxCallbackModule, NvtxCallbackIdCore. */
enum { NVTX_ETID_CALLBACKS = 1 };
enum { NVTX_CB_MODULE_CORE = 1 };
enum {
    NVTX_CBID_CORE_RangeStartA = 5,
    NVTX_CBID_CORE_RangeEnd = 7,
    NVTX_CBID_CORE_RangePushA = 9,
    NVTX_CBID_CORE_RangePop = 11,
};

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_id = 1;
static __thread int depth;

static long tid(void) { return (long)syscall(SYS_gettid); }

/* int nvtxRangePushA(const char *message): the new range's level (0-based). */
static int range_push_a(const char *message) {
    pthread_mutex_lock(&lock);
    fprintf(out, "push %ld %s\n", tid(), message ? message : "");
    fflush(out);
    pthread_mutex_unlock(&lock);
    return depth++;
}

/* int nvtxRangePop(void): the popped range's level, negative when none was pushed. */
static int range_pop(void) {
    pthread_mutex_lock(&lock);
    fprintf(out, "pop %ld\n", tid());
    fflush(out);
    pthread_mutex_unlock(&lock);
    return depth > 0 ? --depth : -1;
}

/* nvtxRangeId_t nvtxRangeStartA(const char *message), nvtxRangeId_t = uint64_t. */
static uint64_t range_start_a(const char *message) {
    pthread_mutex_lock(&lock);
    uint64_t id = next_id++;
    fprintf(out, "start %llu %ld %s\n", (unsigned long long)id, tid(), message ? message : "");
    fflush(out);
    pthread_mutex_unlock(&lock);
    return id;
}

/* void nvtxRangeEnd(nvtxRangeId_t id). */
static void range_end(uint64_t id) {
    pthread_mutex_lock(&lock);
    fprintf(out, "end %llu %ld\n", (unsigned long long)id, tid());
    fflush(out);
    pthread_mutex_unlock(&lock);
}

/* Returns 1 when the functions are installed; 0 tells NVTX to stay a no-op. */
int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    const char *path = getenv("VP_NVTX_RECORD");
    if (!path || !getExportTable)
        return 0;
    const NvtxExportTableCallbacks *cb = getExportTable(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = 0;
    unsigned int size = 0;
    if (!cb || cb->struct_size < sizeof(NvtxExportTableCallbacks) ||
        !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table ||
        size <= NVTX_CBID_CORE_RangePop)
        return 0;
    out = fopen(path, "w");
    if (!out)
        return 0;
    *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)range_push_a;
    *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)range_pop;
    *table[NVTX_CBID_CORE_RangeStartA] = (NvtxFunctionPointer)range_start_a;
    *table[NVTX_CBID_CORE_RangeEnd] = (NvtxFunctionPointer)range_end;
    fprintf(out, "init %ld\n", tid());
    fflush(out);
    return 1;
}
