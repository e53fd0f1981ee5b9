/* vision_preproc's consumer in C (docs/HANDOFF.md, "C and C++"): connect to a node's pool
 * socket, map its blocks (host memory: mmap; CUDA memory: imported through the CUDA
 * driver API, loaded at run time with dlopen), wait for a tensor on the socket (protocol
 * version 2: the node sends each tensor's descriptor when it announces it), acquire it,
 * read it in place, release it; the consumer reports when it acquired and released each
 * tensor. No ROS dependency. C++: consumer.hpp (RAII). The twin of the Python
 * vision_preproc_consumer and the Rust vision_preproc::consumer.
 *
 * A node that speaks only version 1 sends no descriptors: take them from its TensorRef
 * topic (your own ROS 2 subscription), fill a vp_tensor with vp_tensor_from_fields() or the
 * C++ vp::Tensor::from_msg(), and vp_acquire() it as below.
 *
 *     vp_consumer *c; char err[256];
 *     if (vp_connect(path, "my_detector", &c, err, sizeof err) != VP_OK) ... err says why
 *     vp_tensor t;
 *     while (vp_wait(c, 1000, &t) == VP_OK) {
 *         if (vp_acquire(c, &t) != VP_OK) continue;      (reused or withdrawn: skip it)
 *         const float *x = vp_host_data(c, &t);          (CUDA: vp_device_ptr(c, &t))
 *         ... run the network on x ...
 *         vp_release(c, &t, NULL);                        (CUDA: after your stream's work)
 *     }
 *     vp_close(c);
 *
 * Thread safety: one vp_consumer per thread, or your own lock around it. */
#ifndef VISION_PREPROC_CONSUMER_H
#define VISION_PREPROC_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

#include "vision_preproc/boxes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Results. */
enum {
    VP_OK = 0,
    VP_TIMEOUT = 1,   /* vp_wait: nothing within the timeout */
    VP_SKIPPED = 2,   /* vp_acquire: the block was reused before it was taken */
    VP_WITHDRAWN = 3, /* vp_acquire: the node withdrew the set, or its GPU work did not end in time */
    VP_ERROR = -1,    /* vp_last_error() says what */
    VP_CLOSED = -2,   /* the node closed the connection (a new pool, or it exited): connect again */
    VP_V1_ONLY = -3   /* vp_wait: the node speaks protocol version 1 only: descriptors come on the topic */
};

#define VP_MAX_DIMS 8
#define VP_MAX_ITEMS 16 /* the node's most inputs */
#define VP_MEMORY_HOST 0
#define VP_MEMORY_CUDA 1

/* One batch slot (a BatchItem): its camera and the geometry of its boxes. */
typedef struct vp_item {
    char topic[256];
    int valid;    /* 0: a stale camera; no geometry, ignore the slot's outputs */
    int repeated; /* the frame was already in an earlier batch */
    int64_t stamp_ns;
    char frame_id[128];
    char source_encoding[64];
    uint32_t source_width, source_height;
    vp_geometry geometry; /* for vp_to_source / vp::to_source */
    float age_us;
} vp_item;

/* A tensor's descriptor: a TensorRef's fields. */
typedef struct vp_tensor {
    int64_t stamp_ns; /* the header's stamp */
    char frame_id[128];
    char name[64], layout[16], dtype[16];
    uint32_t ndim;
    uint32_t shape[VP_MAX_DIMS];
    int64_t strides[VP_MAX_DIMS]; /* elements; 0 dims of strides: dense */
    uint32_t nstrides;
    uint8_t dtype_code, dtype_bits;
    uint16_t dtype_lanes;
    uint64_t byte_offset, byte_size;
    char pool_id[40];
    char socket_path[256];
    uint32_t block_index;
    uint64_t block_size, generation;
    uint8_t memory_kind; /* VP_MEMORY_HOST or VP_MEMORY_CUDA */
    int32_t device_id;
    uint8_t device_uuid[16];
    uint8_t ipc_event_handle[64];
    uint32_t ipc_event_len; /* 0: ready at once; 64: wait for the node's event */
    uint32_t nitems;
    vp_item items[VP_MAX_ITEMS];
    /* Filled by the library. */
    int64_t sent_ns;     /* the node's clock when it sent the descriptor (0: from the topic) */
    int64_t received_ns; /* when the descriptor arrived here */
    int64_t acquired_ns; /* when vp_acquire made it readable */
    int held;            /* this consumer holds the block */
} vp_tensor;

typedef struct vp_consumer vp_consumer;

/* Connect to the pool socket at `socket_path` (a TensorRef's socket_path, or
 * vp_find_socket()), map its blocks, and upgrade to protocol version 2 when the node speaks
 * it (`name`: how the node's /diagnostics names this consumer; NULL: stay on version 1, the
 * descriptors taken from the topic). CUDA blocks are imported on
 * the hello's device, in its primary context (the one the runtime API and PyTorch use).
 * VP_OK and *out, or VP_ERROR with the reason in err. */
int vp_connect(const char *socket_path, const char *name, vp_consumer **out, char *err, size_t errlen);

/* Close the connection (the node takes back whatever it still held) and unmap the blocks. */
void vp_close(vp_consumer *c);

/* The newest pool socket of this user's nodes ($XDG_RUNTIME_DIR/vision_preproc/, else
 * /tmp/vision_preproc-<uid>/): VP_OK with its path, VP_ERROR when there is none. */
int vp_find_socket(char *path, size_t len);

/* The protocol version in use: 2 (descriptors on the socket) or 1 (the topic). */
int vp_protocol(const vp_consumer *c);
/* "host" or "cuda"; the pool's id; its CUDA device (-1: host). */
const char *vp_memory(const vp_consumer *c);
const char *vp_pool_id(const vp_consumer *c);
int vp_device_id(const vp_consumer *c);
/* Descriptors the node dropped for this consumer (its queue was full), in all. */
uint64_t vp_dropped(const vp_consumer *c);

/* Wait up to timeout_ms (-1: for ever) for the next tensor's descriptor on the socket:
 * VP_OK (t filled), VP_TIMEOUT, VP_CLOSED, VP_V1_ONLY or VP_ERROR. Sends pending reports. */
int vp_wait(vp_consumer *c, int timeout_ms, vp_tensor *t);

/* The version 1 path: a descriptor from your own TensorRef subscription. Fills the fields
 * vp_acquire needs (the rest you may copy from the message, C++: vp::Tensor::from_msg). */
void vp_tensor_from_fields(vp_tensor *t, uint32_t block_index, uint64_t generation, uint8_t memory_kind,
                           uint64_t byte_offset, uint64_t byte_size, const uint8_t *ipc_event_handle,
                           uint32_t ipc_event_len);

/* Take the tensor: hold its block if it still holds t's generation (else VP_SKIPPED), then,
 * for CUDA memory with an event, wait on the host for the node's GPU work (at most 1 s;
 * VP_WITHDRAWN and released when the node withdrew the set, disconnected, or timed out). */
int vp_acquire(vp_consumer *c, vp_tensor *t);

/* The held tensor's first byte: host memory (NULL for CUDA memory), or its device address
 * (0 for host memory). */
const void *vp_host_data(const vp_consumer *c, const vp_tensor *t);
uint64_t vp_device_ptr(const vp_consumer *c, const vp_tensor *t);

/* Give the block back (again: nothing). CUDA memory: first waits for `cuda_stream` (a
 * CUstream / cudaStream_t), or with NULL for the whole context, so that no work of yours
 * still reads it. Queues the tensor's report (sent every 8 reports or 100 ms). */
int vp_release(vp_consumer *c, vp_tensor *t, void *cuda_stream);

/* The reason of the last VP_ERROR on this thread. */
const char *vp_last_error(void);

/* CLOCK_REALTIME in ns (the clock of stamps and reports). */
int64_t vp_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif
