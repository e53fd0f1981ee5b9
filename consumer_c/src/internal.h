/* What the library's files share (not installed). */
#ifndef VP_INTERNAL_H
#define VP_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "vision_preproc/consumer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The hello's magic, its layout's version, the control block's magic (docs/HANDOFF.md). */
#define VP_HELLO_MAGIC "vision_preproc/pool"
#define VP_HELLO_VERSION 1
#define VP_CONTROL_MAGIC "VPCTRL01"
/* The most descriptors one sendmsg carries (Linux's SCM_MAX_FD): control + 252 blocks. */
#define VP_MAX_FDS 253
#define VP_MAX_HELLO (1u << 20)
/* Version 2 frames: u32 length (4 .. 65536), u16 type, u16 0, body. */
#define VP_MAX_FRAME 65536u
enum { VP_UPGRADE = 1, VP_ACCEPT = 2, VP_DESCRIPTOR = 3, VP_DROPPED = 4, VP_REPORT = 5 };
#define VP_REPORT_BYTES 48
#define VP_REPORT_BATCH 8
#define VP_REPORT_EVERY_NS 100000000LL
/* Report flags. */
#define VP_FLAG_SKIPPED 1u
#define VP_FLAG_WITHDRAWN 2u
#define VP_FLAG_TOPIC 4u
/* How long vp_acquire waits for the node's GPU work, and how often it checks the connection. */
#define VP_EVENT_TIMEOUT_NS 1000000000LL
#define VP_CONNECTION_CHECK_NS 10000000LL

/* The hello's fields. */
typedef struct vp_hello {
    char pool_id[40], memory[8];
    long long device_id, blocks, block_size, control_size, row, rows;
    long long records_offset, record_stride, holds_offset, row_stride;
    int speaks_v2; /* "versions" lists 2 */
} vp_hello;

typedef struct vp_cuda vp_cuda;

struct vp_consumer {
    int fd;
    int protocol;
    vp_hello hello;
    uint8_t *control;
    uint8_t **host; /* host blocks, mapped read-only (NULL for CUDA) */
    vp_cuda *cuda;  /* CUDA blocks, imported */
    uint64_t from_generation, dropped_total;
    uint8_t *rbuf; /* bytes received and not yet framed */
    size_t rlen, consumed; /* consumed: the frame handed out last, dropped on the next read */
    uint8_t reports[VP_REPORT_BATCH][VP_REPORT_BYTES];
    int nreports;
    int64_t first_report_ns;
};

/* errors.c-like helpers (consumer.c): set the thread's last error; returns VP_ERROR. */
int vp_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* json.c: a flat JSON object's fields. Calls `field(key, kind, text, len, user)` for each
 * top-level field: kind 's' (string, unescaped simply), 'n' (number), 'a' (array of
 * numbers, text the inside), 'o' (anything else). Returns 0, or -1 when not an object. */
typedef void (*vp_json_field)(const char *key, char kind, const char *text, size_t len, void *user);
int vp_json_object(const char *json, size_t len, vp_json_field field, void *user);

/* cdr.c: a TensorRef's CDR (with its 4-byte encapsulation header) into t. 0 or -1. */
int vp_decode_tensor_ref(const uint8_t *cdr, size_t len, vp_tensor *t);

/* socket.c */
int vp_socket_connect(const char *path);
/* Read the hello (its JSON into *hello) and the fds riding on it (into fds, *nfds). */
int vp_read_hello(int fd, vp_hello *hello, int *fds, int *nfds);
int vp_send_frame(int fd, uint16_t type, const void *body, size_t len);
/* Next whole frame from c's buffer/socket within timeout_ms (-1: for ever): VP_OK with
 * *type, *body (valid until the next call), *len; VP_TIMEOUT; VP_CLOSED; VP_ERROR. */
int vp_recv_frame(vp_consumer *c, int timeout_ms, uint16_t *type, const uint8_t **body, size_t *len);
/* Whether the node still has the connection open. */
int vp_connected(const vp_consumer *c);

/* cuda.c */
int vp_cuda_import(const int *fds, int n, size_t block_size, int device_id, vp_cuda **out);
void vp_cuda_close(vp_cuda *d);
uint64_t vp_cuda_ptr(const vp_cuda *d, uint32_t block);
/* Check a tensor's device and UUID against the pool's. */
int vp_cuda_check_device(vp_cuda *d, int32_t device_id, const uint8_t uuid[16]);
/* Poll the node's IPC event until complete (1), or still_valid false / timeout (0), or a
 * driver error (VP_ERROR). */
int vp_cuda_wait_event(vp_cuda *d, const uint8_t handle[64], int (*still_valid)(void *), void *user,
                       int64_t timeout_ns);
int vp_cuda_synchronize(vp_cuda *d, void *stream);

#ifdef __cplusplus
}
#endif
#endif
