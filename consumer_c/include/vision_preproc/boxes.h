/* Detections back to source pixels, and source pixels to the network image, with the
 * geometry a message publishes (docs/HANDOFF.md, "Boxes back to source pixels"; the Rust
 * twin is vision_preproc::boxes, the Python one vision_preproc_consumer.boxes). Header
 * only, C99 and C++.
 *
 * The convention (docs/SPEC.md, section 4): coordinates are continuous, 0.0 at the
 * left/top edge of the first pixel (pixel i has its centre at i + 0.5), in pixels of the
 * whole source image (before any roi) and of the whole network image (padding included):
 * x = u * scale_x + offset_x, and back u = (x - offset_x) / scale_x; widths and heights
 * scale without the offset. Computed in double, the same operations in the same order as
 * the Rust and Python versions. */
#ifndef VISION_PREPROC_BOXES_H
#define VISION_PREPROC_BOXES_H

#include <math.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The source -> network mapping of one image: a Tensor's fields, or one BatchItem's of a
 * TensorBatch or TensorRef (vp_tensor's items). */
typedef struct vp_geometry {
    double scale_x, scale_y;   /* network pixels per source pixel */
    double offset_x, offset_y; /* network position of the source image's left/top edge */
} vp_geometry;

/* How a detection's numbers are laid out (a flat run of them per detection). */
typedef enum vp_box_format {
    VP_XYXY = 0,  /* x0, y0, x1, y1: two corners */
    VP_XYWH = 1,  /* x, y, w, h: a point of the box (top-left, or centre as YOLO writes
                     it: both map the same way) and its size */
    VP_POINTS = 2 /* x, y */
} vp_box_format;

/* Numbers per detection: 4 for boxes, 2 for points (0 for an unknown format). */
static inline size_t vp_box_arity(vp_box_format f) {
    return f == VP_XYXY || f == VP_XYWH ? 4 : f == VP_POINTS ? 2 : 0;
}

/* 1 when g is usable: positive finite scales, finite offsets (a BatchItem with valid false,
 * a stale camera, has zeros: ignore its slot's detections). */
static inline int vp_geometry_valid(const vp_geometry *g) {
    return g->scale_x > 0 && g->scale_y > 0 && isfinite(g->scale_x) && isfinite(g->scale_y) &&
           isfinite(g->offset_x) && isfinite(g->offset_y);
}

/* Map number i (0-based within its detection) of a detection in format f; to_source != 0:
 * network -> source, else source -> network. */
static inline double vp_map_one(const vp_geometry *g, vp_box_format f, size_t i, double v, int to_source) {
    int is_x = i % 2 == 0;
    int position = f == VP_XYWH ? i < 2 : 1;
    double s = is_x ? g->scale_x : g->scale_y;
    double o = position ? (is_x ? g->offset_x : g->offset_y) : 0.0;
    if (to_source) return position ? (v - o) / s : v / s;
    return position ? v * s + o : v * s;
}

/* Network-pixel detections (count numbers, a whole number of detections of f) to source
 * pixels, in place. Returns 0, or -1 (nothing changed) for a count that is not whole
 * detections, an unknown format or an unusable geometry. */
static inline int vp_to_source_d(const vp_geometry *g, vp_box_format f, double *values, size_t count) {
    size_t n = vp_box_arity(f);
    if (n == 0 || count % n != 0 || !vp_geometry_valid(g)) return -1;
    for (size_t i = 0; i < count; i++) values[i] = vp_map_one(g, f, i % n, values[i], 1);
    return 0;
}

/* Source-pixel detections to network pixels, in place (the inverse of vp_to_source_d). */
static inline int vp_to_network_d(const vp_geometry *g, vp_box_format f, double *values, size_t count) {
    size_t n = vp_box_arity(f);
    if (n == 0 || count % n != 0 || !vp_geometry_valid(g)) return -1;
    for (size_t i = 0; i < count; i++) values[i] = vp_map_one(g, f, i % n, values[i], 0);
    return 0;
}

/* The same on floats (what networks output): computed in double, rounded to float. */
static inline int vp_to_source(const vp_geometry *g, vp_box_format f, float *values, size_t count) {
    size_t n = vp_box_arity(f);
    if (n == 0 || count % n != 0 || !vp_geometry_valid(g)) return -1;
    for (size_t i = 0; i < count; i++) values[i] = (float)vp_map_one(g, f, i % n, values[i], 1);
    return 0;
}

static inline int vp_to_network(const vp_geometry *g, vp_box_format f, float *values, size_t count) {
    size_t n = vp_box_arity(f);
    if (n == 0 || count % n != 0 || !vp_geometry_valid(g)) return -1;
    for (size_t i = 0; i < count; i++) values[i] = (float)vp_map_one(g, f, i % n, values[i], 0);
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
