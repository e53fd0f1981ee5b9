/* A pool's CUDA blocks in this process, through the CUDA driver API loaded at run time
 * (dlopen of the driver's libcuda.so.1: nothing to link, nothing needed for host pools).
 * As the Python consumer's ctypes binding (python/vision_preproc_consumer/cuda.py): each
 * block's fd imported (cuMemImportFromShareableHandle), mapped at an address of this
 * process (cuMemAddressReserve, cuMemMap) and made read-write (cuMemSetAccess), in the
 * device's primary context; the node's IPC event polled from the host, never waited on
 * the GPU (docs/HANDOFF.md, "Synchronisation"). VISION_PREPROC_LIBCUDA names another
 * library (the tests' fake driver). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUevent;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { int type, id; } CUmemLocation;
typedef struct {
    int type, requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct { char reserved[64]; } CUipcEventHandle;
typedef struct { char bytes[16]; } CUuuid;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define MAX_EVENTS 64

/* The driver's functions this file calls (the symbols cuda.h maps the names to). */
#define VP_CUDA_FUNCTIONS(X)                                                                      \
    X(cuInit, (unsigned))                                                                         \
    X(cuDeviceGet, (CUdevice *, int))                                                             \
    X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                      \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                          \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                                   \
    X(cuCtxSetCurrent, (CUcontext))                                                               \
    X(cuCtxSynchronize, (void))                                                                   \
    X(cuStreamSynchronize, (CUstream))                                                            \
    X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, int))              \
    X(cuMemGetAllocationPropertiesFromHandle, (CUmemAllocationProp *, CUmemGenericAllocationHandle)) \
    X(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, int))                \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))      \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))  \
    X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                     \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                                          \
    X(cuMemAddressFree, (CUdeviceptr, size_t))                                                    \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                               \
    X(cuIpcOpenEventHandle, (CUevent *, CUipcEventHandle))                                        \
    X(cuEventQuery, (CUevent))                                                                    \
    X(cuEventDestroy_v2, (CUevent))                                                               \
    X(cuGetErrorName, (CUresult, const char **))

typedef struct driver {
    void *lib;
#define X(name, args) CUresult(*name) args;
    VP_CUDA_FUNCTIONS(X)
#undef X
} driver;

struct vp_cuda {
    driver d;
    CUdevice device;
    int device_id;
    CUcontext context;
    CUuuid uuid;
    int n;
    CUdeviceptr *ptrs;
    size_t *sizes;
    int nevents;
    CUipcEventHandle handles[MAX_EVENTS];
    CUevent events[MAX_EVENTS];
};

static int cuda_fail(const driver *d, const char *call, CUresult e) {
    const char *name = NULL;
    if (d->cuGetErrorName) d->cuGetErrorName(e, &name);
    return vp_fail("%s failed: %s (%d)", call, name ? name : "?", e);
}

#define CALL(d, fn, ...) ((e = (d)->fn(__VA_ARGS__)) == CUDA_SUCCESS ? VP_OK : cuda_fail((d), #fn, e))

static int load(driver *d) {
    const char *name = getenv("VISION_PREPROC_LIBCUDA");
    if (!name || !*name) name = "libcuda.so.1";
    d->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!d->lib)
        return vp_fail("the pool's blocks are CUDA memory: mapping them needs the NVIDIA driver's %s, which could not "
                       "be loaded (%s): run this consumer on the node's machine with its driver, or the node with "
                       "`backend: cpu` (host blocks)", name, dlerror());
#define X(fn, args)                                                                                      \
    *(void **)&d->fn = dlsym(d->lib, #fn);                                                               \
    if (!d->fn)                                                                                          \
        return vp_fail("%s has no %s: the pool's CUDA blocks need a driver with CUDA 10.2's virtual memory " \
                       "management (update the NVIDIA driver)", name, #fn);
    VP_CUDA_FUNCTIONS(X)
#undef X
    return VP_OK;
}

/* Import and map one block's fd: its address and mapped size. */
static int map_one(vp_cuda *c, int fd, size_t block_size, CUdeviceptr *ptr, size_t *size) {
    driver *d = &c->d;
    CUresult e;
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    size_t gran = 0;
    memset(&prop, 0, sizeof prop);
    if (CALL(d, cuMemImportFromShareableHandle, &h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return VP_ERROR;
    int rc = CALL(d, cuMemGetAllocationPropertiesFromHandle, &prop, h);
    if (rc == VP_OK) rc = CALL(d, cuMemGetAllocationGranularity, &gran, &prop, 0);
    *size = gran ? (block_size + gran - 1) / gran * gran : block_size;
    if (rc == VP_OK) rc = CALL(d, cuMemAddressReserve, ptr, *size, 0, 0, 0);
    if (rc == VP_OK) {
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, c->device_id}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        rc = CALL(d, cuMemMap, *ptr, *size, 0, h, 0);
        if (rc == VP_OK && CALL(d, cuMemSetAccess, *ptr, *size, &access, 1) != VP_OK) {
            d->cuMemUnmap(*ptr, *size);
            rc = VP_ERROR;
        }
        if (rc != VP_OK) d->cuMemAddressFree(*ptr, *size);
    }
    d->cuMemRelease(h); /* the mapping keeps the memory */
    return rc;
}

int vp_cuda_import(const int *fds, int n, size_t block_size, int device_id, vp_cuda **out) {
    vp_cuda *c = calloc(1, sizeof *c);
    if (!c) return vp_fail("out of memory");
    *out = c; /* vp_cuda_close frees what was made, on failure too */
    c->device_id = device_id;
    c->ptrs = calloc((size_t)n, sizeof *c->ptrs);
    c->sizes = calloc((size_t)n, sizeof *c->sizes);
    if (!c->ptrs || !c->sizes) return vp_fail("out of memory");
    driver *d = &c->d;
    CUresult e;
    if (load(d) != VP_OK || CALL(d, cuInit, 0) || CALL(d, cuDeviceGet, &c->device, device_id) ||
        CALL(d, cuDevicePrimaryCtxRetain, &c->context, c->device) || CALL(d, cuCtxSetCurrent, c->context) ||
        CALL(d, cuDeviceGetUuid, &c->uuid, c->device))
        return VP_ERROR;
    for (int i = 0; i < n; i++) {
        if (map_one(c, fds[i], block_size, &c->ptrs[i], &c->sizes[i]) != VP_OK) return VP_ERROR;
        c->n = i + 1;
    }
    return VP_OK;
}

void vp_cuda_close(vp_cuda *c) {
    if (!c) return;
    driver *d = &c->d;
    if (c->context) {
        d->cuCtxSetCurrent(c->context);
        for (int i = 0; i < c->nevents; i++) d->cuEventDestroy_v2(c->events[i]);
        for (int i = 0; i < c->n; i++) {
            d->cuMemUnmap(c->ptrs[i], c->sizes[i]);
            d->cuMemAddressFree(c->ptrs[i], c->sizes[i]);
        }
        d->cuDevicePrimaryCtxRelease_v2(c->device);
    }
    if (d->lib) dlclose(d->lib);
    free(c->ptrs);
    free(c->sizes);
    free(c);
}

uint64_t vp_cuda_ptr(const vp_cuda *c, uint32_t block) { return (int)block < c->n ? c->ptrs[block] : 0; }

int vp_cuda_check_device(vp_cuda *c, int32_t device_id, const uint8_t uuid[16]) {
    static const uint8_t zero[16];
    if (device_id != c->device_id)
        return vp_fail("the tensor is on device %d, the pool's hello says device %d", device_id, c->device_id);
    if (memcmp(uuid, zero, 16) != 0 && memcmp(uuid, c->uuid.bytes, 16) != 0)
        return vp_fail("the tensor's device %d has another UUID than this process's device %d: the node and this "
                       "process number the GPUs differently (CUDA_VISIBLE_DEVICES?)", device_id, c->device_id);
    return VP_OK;
}

/* The node's event for `handle`, opened once (the node reuses a few). */
static int event(vp_cuda *c, const uint8_t handle[64], CUevent *ev) {
    for (int i = 0; i < c->nevents; i++)
        if (memcmp(c->handles[i].reserved, handle, 64) == 0) return *ev = c->events[i], VP_OK;
    if (c->nevents == MAX_EVENTS) {
        for (int i = 0; i < c->nevents; i++) c->d.cuEventDestroy_v2(c->events[i]);
        c->nevents = 0;
    }
    CUipcEventHandle h;
    memcpy(h.reserved, handle, 64);
    CUresult e;
    if (CALL(&c->d, cuIpcOpenEventHandle, ev, h)) return VP_ERROR;
    c->handles[c->nevents] = h;
    c->events[c->nevents++] = *ev;
    return VP_OK;
}

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int vp_cuda_wait_event(vp_cuda *c, const uint8_t handle[64], int (*still_valid)(void *), void *user,
                       int64_t timeout_ns) {
    CUevent ev;
    CUresult e;
    if (CALL(&c->d, cuCtxSetCurrent, c->context) || event(c, handle, &ev) != VP_OK) return VP_ERROR;
    int64_t start = monotonic_ns();
    for (;;) {
        e = c->d.cuEventQuery(ev);
        if (e == CUDA_SUCCESS) return still_valid(user); /* withdrawn as it completed: not to be read */
        if (!still_valid(user)) return 0;
        if (e != CUDA_ERROR_NOT_READY) return cuda_fail(&c->d, "cuEventQuery", e);
        int64_t now = monotonic_ns();
        if (now - start >= timeout_ns) return 0;
        if (now - start >= 200000) { /* spin 0.2 ms, then sleep 50 us between queries */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

int vp_cuda_synchronize(vp_cuda *c, void *stream) {
    CUresult e;
    if (CALL(&c->d, cuCtxSetCurrent, c->context)) return VP_ERROR;
    return stream ? CALL(&c->d, cuStreamSynchronize, stream) : CALL(&c->d, cuCtxSynchronize);
}
