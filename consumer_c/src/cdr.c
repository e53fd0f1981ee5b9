/* A vision_preproc_msgs/TensorRef in CDR (XCDR1, little-endian, the 4-byte encapsulation
 * header first), as a version 2 DESCRIPTOR carries it (docs/HANDOFF.md), into a vp_tensor.
 * Field order: msgs/vision_preproc_msgs/msg/TensorRef.msg and BatchItem.msg. */
#include <string.h>

#include "internal.h"

typedef struct reader {
    const uint8_t *p; /* the body, after the encapsulation header (alignment origin) */
    size_t n, at;
    int bad;
} reader;

static void align(reader *r, size_t a) {
    r->at = (r->at + a - 1) / a * a;
}

static const uint8_t *take(reader *r, size_t len, size_t a) {
    align(r, a);
    if (r->bad || r->at > r->n || len > r->n - r->at) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *q = r->p + r->at;
    r->at += len;
    return q;
}

static uint64_t u(reader *r, size_t len) {
    const uint8_t *q = take(r, len, len);
    uint64_t v = 0;
    for (size_t i = 0; q && i < len; i++) v |= (uint64_t)q[i] << (8 * i);
    return v;
}

static float f32(reader *r) {
    uint32_t bits = (uint32_t)u(r, 4);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A string into out (truncated to cap - 1 bytes, always terminated). */
static void str(reader *r, char *out, size_t cap) {
    uint32_t len = (uint32_t)u(r, 4);
    const uint8_t *q = take(r, len, 1);
    out[0] = 0;
    if (!q || len == 0) return;
    size_t n = len - 1 < cap - 1 ? len - 1 : cap - 1; /* the length counts the NUL */
    memcpy(out, q, n);
    out[n] = 0;
}

static int64_t stamp(reader *r, char *frame_id, size_t cap) {
    int32_t sec = (int32_t)u(r, 4);
    uint32_t nsec = (uint32_t)u(r, 4);
    str(r, frame_id, cap);
    return (int64_t)sec * 1000000000LL + nsec;
}

static void item(reader *r, vp_item *it) {
    str(r, it->topic, sizeof it->topic);
    it->valid = (int)u(r, 1);
    it->repeated = (int)u(r, 1);
    it->stamp_ns = stamp(r, it->frame_id, sizeof it->frame_id);
    str(r, it->source_encoding, sizeof it->source_encoding);
    it->source_width = (uint32_t)u(r, 4);
    it->source_height = (uint32_t)u(r, 4);
    it->geometry.scale_x = f32(r);
    it->geometry.scale_y = f32(r);
    it->geometry.offset_x = f32(r);
    it->geometry.offset_y = f32(r);
    it->age_us = f32(r);
}

/* The tensor's fields after the header, up to the items. */
static int body(reader *r, vp_tensor *t) {
    str(r, t->name, sizeof t->name);
    str(r, t->layout, sizeof t->layout);
    str(r, t->dtype, sizeof t->dtype);
    t->ndim = (uint32_t)u(r, 4);
    if (t->ndim > VP_MAX_DIMS) return -1;
    for (uint32_t i = 0; i < t->ndim; i++) t->shape[i] = (uint32_t)u(r, 4);
    t->dtype_code = (uint8_t)u(r, 1);
    t->dtype_bits = (uint8_t)u(r, 1);
    t->dtype_lanes = (uint16_t)u(r, 2);
    t->nstrides = (uint32_t)u(r, 4);
    if (t->nstrides > VP_MAX_DIMS) return -1;
    for (uint32_t i = 0; i < t->nstrides; i++) t->strides[i] = (int64_t)u(r, 8);
    t->byte_offset = u(r, 8);
    t->byte_size = u(r, 8);
    str(r, t->pool_id, sizeof t->pool_id);
    str(r, t->socket_path, sizeof t->socket_path);
    t->block_index = (uint32_t)u(r, 4);
    t->block_size = u(r, 8);
    t->generation = u(r, 8);
    t->memory_kind = (uint8_t)u(r, 1);
    t->device_id = (int32_t)u(r, 4);
    const uint8_t *uuid = take(r, 16, 1);
    if (uuid) memcpy(t->device_uuid, uuid, 16);
    t->ipc_event_len = (uint32_t)u(r, 4);
    if (t->ipc_event_len != 0 && t->ipc_event_len != 64) return -1;
    const uint8_t *ev = take(r, t->ipc_event_len, 1);
    if (ev) memcpy(t->ipc_event_handle, ev, t->ipc_event_len);
    return 0;
}

int vp_decode_tensor_ref(const uint8_t *cdr, size_t len, vp_tensor *t) {
    memset(t, 0, sizeof *t);
    if (len < 4 || cdr[0] != 0 || cdr[1] != 1) return -1; /* CDR_LE */
    reader r = {cdr + 4, len - 4, 0, 0};
    t->stamp_ns = stamp(&r, t->frame_id, sizeof t->frame_id);
    if (body(&r, t) != 0) return -1;
    t->nitems = (uint32_t)u(&r, 4);
    if (t->nitems > VP_MAX_ITEMS) return -1;
    for (uint32_t i = 0; i < t->nitems; i++) item(&r, &t->items[i]);
    return r.bad ? -1 : 0;
}
