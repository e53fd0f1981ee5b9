/* The consumer: a connection to a node's pool, its blocks mapped, tensors taken and given
 * back with the control block's holds, and the version 2 ready signal and reports
 * (docs/HANDOFF.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static __thread char last_error[512];

int vp_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return VP_ERROR;
}

const char *vp_last_error(void) { return last_error; }

int64_t vp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void close_fds(int *fds, int n) {
    for (int i = 0; i < n; i++) close(fds[i]);
}

/* Map the control block read-write and, for host memory, every block read-only. */
static int map_blocks(vp_consumer *c, const int *fds) {
    const vp_hello *h = &c->hello;
    void *control = mmap(NULL, (size_t)h->control_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (control == MAP_FAILED) return vp_fail("mapping the control block: %s", strerror(errno));
    c->control = control;
    if (memcmp(c->control, VP_CONTROL_MAGIC, 8) != 0) return vp_fail("the control block has no %s", VP_CONTROL_MAGIC);
    if (strcmp(h->memory, "cuda") == 0)
        return vp_cuda_import(fds + 1, (int)h->blocks, (size_t)h->block_size, (int)h->device_id, &c->cuda);
    c->host = calloc((size_t)h->blocks, sizeof *c->host);
    if (!c->host) return vp_fail("out of memory");
    for (long long b = 0; b < h->blocks; b++) {
        void *p = mmap(NULL, (size_t)h->block_size, PROT_READ, MAP_SHARED, fds[1 + b], 0);
        if (p == MAP_FAILED) return vp_fail("mapping block %lld: %s", b, strerror(errno));
        c->host[b] = p;
    }
    return VP_OK;
}

typedef struct accept_parse {
    long long version, from_generation, queue;
} accept_parse;

static void accept_field(const char *key, char kind, const char *text, size_t len, void *user) {
    accept_parse *a = user;
    char buf[32];
    if (kind != 'n') return;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 31 ? len : 31), text);
    long long v = strtoll(buf, NULL, 10);
    if (strcmp(key, "version") == 0) a->version = v;
    if (strcmp(key, "from_generation") == 0) a->from_generation = v;
    if (strcmp(key, "queue") == 0) a->queue = v;
}

/* UPGRADE to version 2 and wait (1 s) for ACCEPT; without it, stay on version 1. */
static int upgrade(vp_consumer *c, const char *name) {
    char body[160];
    char clean[65];
    size_t n = 0;
    for (const char *p = name; *p && n < 64; p++)
        if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) clean[n++] = *p;
    clean[n] = 0;
    int len = snprintf(body, sizeof body, "{\"version\": 2, \"name\": \"%s\"}", clean);
    if (vp_send_frame(c->fd, VP_UPGRADE, body, (size_t)len) != VP_OK) return VP_ERROR;
    uint16_t type;
    const uint8_t *b;
    size_t blen;
    int rc = vp_recv_frame(c, 1000, &type, &b, &blen);
    if (rc == VP_TIMEOUT) return VP_OK; /* no answer: the topic, as version 1 */
    if (rc != VP_OK) return rc == VP_CLOSED ? vp_fail("the node closed the connection after UPGRADE") : rc;
    accept_parse a = {0, 0, 0};
    if (type != VP_ACCEPT || vp_json_object((const char *)b, blen, accept_field, &a) != 0 || a.version != 2)
        return vp_fail("the node answered UPGRADE with a frame of type %u, not ACCEPT", type);
    c->from_generation = (uint64_t)a.from_generation;
    c->protocol = 2;
    return VP_OK;
}

int vp_connect(const char *socket_path, const char *name, vp_consumer **out, char *err, size_t errlen) {
    *out = NULL;
    vp_consumer *c = calloc(1, sizeof *c);
    int fds[VP_MAX_FDS], nfds = 0, rc = VP_ERROR;
    if (!c || !(c->rbuf = malloc(VP_MAX_FRAME + 8))) {
        free(c);
        rc = vp_fail("out of memory");
        goto done;
    }
    c->protocol = 1;
    c->fd = vp_socket_connect(socket_path);
    if (c->fd < 0) goto fail;
    if (vp_read_hello(c->fd, &c->hello, fds, &nfds) != VP_OK || map_blocks(c, fds) != VP_OK) goto fail;
    close_fds(fds, nfds);
    nfds = 0;
    if (c->hello.speaks_v2 && name && upgrade(c, name) != VP_OK) goto fail; /* NULL: stay on version 1 */
    *out = c;
    rc = VP_OK;
    goto done;
fail:
    close_fds(fds, nfds);
    {
        char why[512];
        snprintf(why, sizeof why, "%s", last_error);
        vp_close(c);
        vp_fail("%s", why);
    }
done:
    if (rc != VP_OK && err && errlen) snprintf(err, errlen, "%s", last_error);
    return rc;
}

static void flush_reports(vp_consumer *c);

void vp_close(vp_consumer *c) {
    if (!c) return;
    if (c->fd > 0) flush_reports(c);
    if (c->cuda) vp_cuda_close(c->cuda);
    for (long long b = 0; c->host && b < c->hello.blocks; b++)
        if (c->host[b]) munmap(c->host[b], (size_t)c->hello.block_size);
    free(c->host);
    if (c->control) munmap(c->control, (size_t)c->hello.control_size);
    if (c->fd > 0) close(c->fd);
    free(c->rbuf);
    free(c);
}

int vp_protocol(const vp_consumer *c) { return c->protocol; }
const char *vp_memory(const vp_consumer *c) { return c->hello.memory; }
const char *vp_pool_id(const vp_consumer *c) { return c->hello.pool_id; }
int vp_device_id(const vp_consumer *c) { return (int)c->hello.device_id; }
uint64_t vp_dropped(const vp_consumer *c) { return c->dropped_total; }

static void flush_reports(vp_consumer *c) {
    if (c->nreports == 0 || c->protocol < 2) {
        c->nreports = 0;
        return;
    }
    uint8_t body[8 + VP_REPORT_BATCH * VP_REPORT_BYTES] = {0};
    body[0] = (uint8_t)c->nreports;
    memcpy(body + 8, c->reports, (size_t)c->nreports * VP_REPORT_BYTES);
    vp_send_frame(c->fd, VP_REPORT, body, 8 + (size_t)c->nreports * VP_REPORT_BYTES);
    c->nreports = 0;
}

static void put(uint8_t *p, uint64_t v, int len) {
    for (int i = 0; i < len; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Queue t's report (sent every VP_REPORT_BATCH, or VP_REPORT_EVERY_NS after the first). */
static void report(vp_consumer *c, const vp_tensor *t, int64_t released_ns, uint32_t flags) {
    if (c->protocol < 2) return;
    uint8_t *r = c->reports[c->nreports];
    put(r, t->generation, 8);
    put(r + 8, (uint64_t)t->stamp_ns, 8);
    put(r + 16, (uint64_t)t->received_ns, 8);
    put(r + 24, (uint64_t)t->acquired_ns, 8);
    put(r + 32, (uint64_t)released_ns, 8);
    put(r + 40, t->block_index, 4);
    put(r + 44, flags | (t->sent_ns == 0 ? VP_FLAG_TOPIC : 0), 4);
    if (c->nreports++ == 0) c->first_report_ns = monotonic_ns();
    if (c->nreports == VP_REPORT_BATCH) flush_reports(c);
}

int vp_wait(vp_consumer *c, int timeout_ms, vp_tensor *t) {
    if (c->protocol < 2) return vp_fail("the node speaks protocol version 1 only"), VP_V1_ONLY;
    int64_t deadline = timeout_ms < 0 ? -1 : monotonic_ns() + (int64_t)timeout_ms * 1000000LL;
    for (;;) {
        int64_t now = monotonic_ns();
        if (c->nreports && now - c->first_report_ns >= VP_REPORT_EVERY_NS) flush_reports(c);
        int64_t until = deadline;
        if (c->nreports && (until < 0 || c->first_report_ns + VP_REPORT_EVERY_NS < until))
            until = c->first_report_ns + VP_REPORT_EVERY_NS;
        int wait_ms = until < 0 ? -1 : (int)((until - now + 999999) / 1000000);
        uint16_t type;
        const uint8_t *body;
        size_t len;
        int rc = vp_recv_frame(c, wait_ms < 0 ? -1 : wait_ms, &type, &body, &len);
        if (rc == VP_TIMEOUT) {
            if (deadline >= 0 && monotonic_ns() >= deadline) return VP_TIMEOUT;
            continue;
        }
        if (rc != VP_OK) return rc;
        if (type == VP_DROPPED && len >= 16) {
            uint64_t total = 0;
            for (int i = 0; i < 8; i++) total |= (uint64_t)body[8 + i] << (8 * i);
            c->dropped_total = total;
        } else if (type == VP_DESCRIPTOR && len >= 12) {
            int64_t sent = 0;
            for (int i = 0; i < 8; i++) sent |= (int64_t)((uint64_t)body[i] << (8 * i));
            if (vp_decode_tensor_ref(body + 8, len - 8, t) != 0) return vp_fail("a descriptor that is not a TensorRef");
            t->sent_ns = sent;
            t->received_ns = vp_now_ns();
            return VP_OK;
        }
    }
}

void vp_tensor_from_fields(vp_tensor *t, uint32_t block_index, uint64_t generation, uint8_t memory_kind,
                           uint64_t byte_offset, uint64_t byte_size, const uint8_t *ipc_event_handle,
                           uint32_t ipc_event_len) {
    t->block_index = block_index;
    t->generation = generation;
    t->memory_kind = memory_kind;
    t->byte_offset = byte_offset;
    t->byte_size = byte_size;
    t->ipc_event_len = ipc_event_len == 64 ? 64 : 0;
    if (t->ipc_event_len) memcpy(t->ipc_event_handle, ipc_event_handle, 64);
    t->sent_ns = 0;
    t->received_ns = vp_now_ns();
    t->acquired_ns = 0;
    t->held = 0;
}

static uint32_t *hold(const vp_consumer *c, uint32_t block) {
    const vp_hello *h = &c->hello;
    return (uint32_t *)(c->control + h->holds_offset + h->row * h->row_stride + 4 * (long long)block);
}

static uint64_t generation(const vp_consumer *c, uint32_t block) {
    const vp_hello *h = &c->hello;
    uint64_t *g = (uint64_t *)(c->control + h->records_offset + (long long)block * h->record_stride);
    return __atomic_load_n(g, __ATOMIC_SEQ_CST);
}

typedef struct still_valid_state {
    vp_consumer *c;
    const vp_tensor *t;
    int64_t next_check;
} still_valid_state;

/* The block still holds t's generation, and the node is still connected (every 10 ms). */
static int still_valid(void *user) {
    still_valid_state *s = user;
    int64_t now = monotonic_ns();
    if (now >= s->next_check) {
        if (!vp_connected(s->c)) return 0;
        s->next_check = now + VP_CONNECTION_CHECK_NS;
    }
    return generation(s->c, s->t->block_index) == s->t->generation;
}

int vp_acquire(vp_consumer *c, vp_tensor *t) {
    if (t->held) return VP_OK;
    if (t->block_index >= c->hello.blocks)
        return vp_fail("block %u: the pool has %lld blocks", t->block_index, c->hello.blocks);
    if (t->byte_offset + t->byte_size > (uint64_t)c->hello.block_size)
        return vp_fail("the tensor's bytes end past the block");
    if ((t->memory_kind == VP_MEMORY_CUDA) != (c->cuda != NULL))
        return vp_fail("the tensor says %s memory, the pool's hello says %s",
                       t->memory_kind == VP_MEMORY_CUDA ? "CUDA" : "host", c->hello.memory);
    uint32_t *h = hold(c, t->block_index);
    __atomic_fetch_add(h, 1, __ATOMIC_SEQ_CST);
    if (generation(c, t->block_index) != t->generation) {
        __atomic_fetch_sub(h, 1, __ATOMIC_SEQ_CST);
        report(c, t, 0, VP_FLAG_SKIPPED);
        return VP_SKIPPED;
    }
    t->held = 1;
    if (c->cuda && t->ipc_event_len == 64) {
        int rc = vp_cuda_check_device(c->cuda, t->device_id, t->device_uuid);
        still_valid_state s = {c, t, 0};
        if (rc == VP_OK) rc = vp_cuda_wait_event(c->cuda, t->ipc_event_handle, still_valid, &s, VP_EVENT_TIMEOUT_NS);
        if (rc != 1) {
            t->held = 0;
            __atomic_fetch_sub(h, 1, __ATOMIC_SEQ_CST);
            report(c, t, 0, VP_FLAG_WITHDRAWN);
            return rc == 0 ? VP_WITHDRAWN : VP_ERROR;
        }
    }
    t->acquired_ns = vp_now_ns();
    return VP_OK;
}

const void *vp_host_data(const vp_consumer *c, const vp_tensor *t) {
    if (!c->host || !t->held || t->block_index >= c->hello.blocks) return NULL;
    return c->host[t->block_index] + t->byte_offset;
}

uint64_t vp_device_ptr(const vp_consumer *c, const vp_tensor *t) {
    if (!c->cuda || !t->held || t->block_index >= c->hello.blocks) return 0;
    return vp_cuda_ptr(c->cuda, t->block_index) + t->byte_offset;
}

int vp_release(vp_consumer *c, vp_tensor *t, void *cuda_stream) {
    if (!t->held) return VP_OK;
    int rc = c->cuda ? vp_cuda_synchronize(c->cuda, cuda_stream) : VP_OK;
    t->held = 0;
    __atomic_fetch_sub(hold(c, t->block_index), 1, __ATOMIC_SEQ_CST);
    report(c, t, vp_now_ns(), 0);
    return rc;
}
