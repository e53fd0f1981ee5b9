"""Detections back to source pixels, and source pixels to the network image, with the
geometry a message publishes (docs/HANDOFF.md, *Boxes back to source pixels*; the Rust
twin is `vision_preproc::boxes`, the C/C++ one `consumer_c/include/vision_preproc/boxes.h`).

    from vision_preproc_consumer import to_source
    boxes_src = to_source(boxes_net, frame.msg.items[0], "xyxy")   # (N, 4) in source pixels

The convention (docs/SPEC.md, section 4): coordinates are continuous, 0.0 at the left/top
edge of the first pixel (pixel i has its centre at i + 0.5), in pixels of the whole source
image (before any roi) and of the whole network image (padding included):
`x = u * scale_x + offset_x`, and back `u = (x - offset_x) / scale_x`; widths and heights
scale without the offset. Formats: "xyxy" (two corners), "xywh" (a point of the box, its
top-left corner or its centre as YOLO writes it: both map the same way, and its size),
"points" (x, y). Computed in float64, the same operations in the same order as the Rust
and C++ versions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Numbers per detection of each format.
ARITY = {"xyxy": 4, "xywh": 4, "points": 2}
_FIELDS = ("scale_x", "scale_y", "offset_x", "offset_y")


def geometry(item: Any) -> tuple[float, float, float, float]:
    """(scale_x, scale_y, offset_x, offset_y) of `item`: a Tensor, a BatchItem (of a
    TensorBatch's or TensorRef's `items`), a TensorRef or TensorBatch of one item, a Frame
    (its message), a dict with those keys, or a 4-sequence. Raises ValueError for a batch
    of several items (pass `msg.items[i]`) and for an item with `valid` false (a stale
    camera: no geometry; ignore its slot's detections)."""
    if hasattr(item, "msg") and not hasattr(item, "scale_x"):  # a Frame
        item = item.msg
    if not hasattr(item, "scale_x") and hasattr(item, "items") and not isinstance(item, dict):
        items = list(item.items)
        if len(items) != 1:
            raise ValueError(f"the message has {len(items)} items, one per camera: pass msg.items[i], the "
                             "item of the batch slot the detections came from")
        item = items[0]
    if getattr(item, "valid", True) is False:
        raise ValueError(f"BatchItem of {getattr(item, 'topic', '?')!r} has valid: false (a stale camera): it has "
                         "no geometry; ignore the detections of its slot")
    if isinstance(item, dict):
        values = [item[f] for f in _FIELDS]
    elif all(hasattr(item, f) for f in _FIELDS):
        values = [getattr(item, f) for f in _FIELDS]
    else:
        values = list(item)
        if len(values) != 4:
            raise ValueError(f"geometry {item!r}: expected (scale_x, scale_y, offset_x, offset_y)")
    sx, sy, ox, oy = (float(v) for v in values)
    if not (sx > 0 and sy > 0 and math.isfinite(sx) and math.isfinite(sy) and math.isfinite(ox)
            and math.isfinite(oy)):
        raise ValueError(f"geometry scale ({sx}, {sy}), offset ({ox}, {oy}): the scales must be positive and all "
                         "four finite (a BatchItem with valid: false has zeros: ignore its slot's detections)")
    return sx, sy, ox, oy


def _prepare(values: Any, fmt: str) -> tuple[np.ndarray, int]:
    if fmt not in ARITY:
        raise ValueError(f"format {fmt!r}: expected one of {sorted(ARITY)}")
    a = np.array(values, dtype=np.float64)  # a copy: the input is never changed
    n = ARITY[fmt]
    if a.ndim == 0 or a.shape[-1] != n:
        raise ValueError(f"{fmt} detections need a last dimension of {n}, got shape {a.shape}")
    return a, n


def _positions(fmt: str) -> tuple[slice, slice]:
    """(x positions, y positions) columns; for xywh the sizes are columns 2 and 3."""
    return (slice(0, 1), slice(1, 2)) if fmt == "xywh" else (slice(0, None, 2), slice(1, None, 2))


def to_source(values: Any, item: Any, fmt: str = "xyxy") -> np.ndarray:
    """Network-pixel detections (shape (..., 4) for "xyxy"/"xywh", (..., 2) for
    "points") as float64 source pixels, in a new array. `item`: see geometry()."""
    sx, sy, ox, oy = geometry(item)
    a, _ = _prepare(values, fmt)
    px, py = _positions(fmt)
    a[..., px] = (a[..., px] - ox) / sx
    a[..., py] = (a[..., py] - oy) / sy
    if fmt == "xywh":
        a[..., 2] = a[..., 2] / sx
        a[..., 3] = a[..., 3] / sy
    return a


def to_network(values: Any, item: Any, fmt: str = "xyxy") -> np.ndarray:
    """Source-pixel detections as float64 network pixels (the inverse of to_source)."""
    sx, sy, ox, oy = geometry(item)
    a, _ = _prepare(values, fmt)
    px, py = _positions(fmt)
    a[..., px] = a[..., px] * sx + ox
    a[..., py] = a[..., py] * sy + oy
    if fmt == "xywh":
        a[..., 2] = a[..., 2] * sx
        a[..., 3] = a[..., 3] * sy
    return a
