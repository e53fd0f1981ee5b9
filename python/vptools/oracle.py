"""Independent oracle of the preprocessing specification (docs/SPEC.md), written with
OpenCV and NumPy only: nothing here comes from vision_preproc's code.

    decode     cv2.cvtColor with the code of each encoding (table ENCODINGS), 16-bit / 257
    grey       cv2.cvtColor(rgb, COLOR_RGB2GRAY) on the decoded integers (u8 or u16)
    roi, crop  NumPy slices
    resize     cv2.resize(decoded.astype(float32), (content_w, content_h), INTER_LINEAR |
               INTER_NEAREST)
    letterbox  cv2.copyMakeBorder(BORDER_CONSTANT, value=pad_value)
    normalize  (pixel * pixel_scale - mean[c]) / std[c] in float64, channels in
               channel_order
    conv2d     oracle_conv.apply_conv (the conv2d engineer's oracle), when conv.kernel is
               not none
    layout     NCHW or NHWC, batch 1

`preprocess` returns float64, before any float16 rounding (tolerances.assert_close rounds
for itself).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

DEFAULTS = {
    "network_image_width": 640,
    "network_image_height": 480,
    "roi": [],
    "interpolation": "linear",
    "resize_mode": "letterbox",
    "pad_value": [0.0, 0.0, 0.0],
    "letterbox_anchor": "center",
    "pixel_scale": 1.0 / 255.0,
    "image_mean": [0.5, 0.5, 0.5],
    "image_stddev": [0.5, 0.5, 0.5],
    "channel_order": "rgb",
    "output_channels": 3,
    "output_layout": "NCHW",
    "output_dtype": "float32",
    "conv": {"kernel": "none"},
}

# encoding -> (bytes per pixel of the first plane, how to decode)
ENCODINGS = {
    "rgb8": (3, None),
    "bgr8": (3, cv2.COLOR_BGR2RGB),
    "rgba8": (4, cv2.COLOR_RGBA2RGB),
    "bgra8": (4, cv2.COLOR_BGRA2RGB),
    "mono8": (1, None),
    "mono16": (2, None),
    "rgb16": (6, None),
    "bgr16": (6, "swap"),
    "yuyv": (2, cv2.COLOR_YUV2RGB_YUY2),
    "yuv422_yuy2": (2, cv2.COLOR_YUV2RGB_YUY2),
    "uyvy": (2, cv2.COLOR_YUV2RGB_UYVY),
    "yuv422": (2, cv2.COLOR_YUV2RGB_UYVY),
    "nv12": (1, cv2.COLOR_YUV2RGB_NV12),
    "nv21": (1, cv2.COLOR_YUV2RGB_NV21),
    # OpenCV 5 names the Bayer patterns by their top-left 2x2 tile in the four-letter
    # aliases; COLOR_BayerRGGB2RGB == COLOR_BayerBG2RGB.
    "bayer_rggb8": (1, cv2.COLOR_BayerRGGB2RGB),
    "bayer_bggr8": (1, cv2.COLOR_BayerBGGR2RGB),
    "bayer_gbrg8": (1, cv2.COLOR_BayerGBRG2RGB),
    "bayer_grbg8": (1, cv2.COLOR_BayerGRBG2RGB),
}


def rows(data: bytes, step: int, nrows: int, row_bytes: int) -> np.ndarray:
    """The first `row_bytes` of each of `nrows` rows of `step` bytes."""
    buf = np.frombuffer(data, np.uint8)
    assert buf.size == step * nrows, (buf.size, step, nrows)
    return buf.reshape(nrows, step)[:, :row_bytes]


def decode_integers(data: bytes, encoding: str, width: int, height: int, step: int,
                    big_endian: bool = False) -> np.ndarray:
    """The decoded image as integers: (H, W, 3) RGB or (H, W) grey, uint8 (uint16 for
    16-bit encodings)."""
    bpp, code = ENCODINGS[encoding]
    if encoding in ("nv12", "nv21"):
        buf = np.ascontiguousarray(rows(data, step, height * 3 // 2, width))
        return cv2.cvtColor(buf, code)
    raw = np.ascontiguousarray(rows(data, step, height, width * bpp))
    if encoding in ("mono16", "rgb16", "bgr16"):
        v = raw.view(">u2" if big_endian else "<u2").astype(np.uint16)
        if encoding == "mono16":
            return v.reshape(height, width)
        v = v.reshape(height, width, 3)
        return np.ascontiguousarray(v[..., ::-1]) if code == "swap" else v
    if encoding == "mono8":
        return raw.reshape(height, width)
    if encoding.startswith("bayer"):
        return cv2.cvtColor(raw.reshape(height, width), code)
    if encoding in ("rgb8", "bgr8", "rgba8", "bgra8"):
        img = raw.reshape(height, width, bpp)
        return img if code is None else cv2.cvtColor(img, code)
    # 4:2:2
    return cv2.cvtColor(raw.reshape(height, width, 2), code)


def decode(data: bytes, encoding: str, width: int, height: int, step: int,
           big_endian: bool, channels: int) -> np.ndarray:
    """Decoded planes in 8-bit units, float32: (H, W, 3) RGB or (H, W) grey."""
    img = decode_integers(data, encoding, width, height, step, big_endian)
    sixteen = img.dtype == np.uint16
    if channels == 1 and img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)  # OpenCV's fixed point, u8 or u16
    elif channels == 3 and img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    out = img.astype(np.float32)
    if sixteen:
        out = out / np.float32(257.0)
    return out


def _round(v: float) -> int:
    """Round half away from zero (positive values)."""
    f = math.floor(v)
    return f + 1 if v - f >= 0.5 else f


def geometry(src_w: int, src_h: int, cfg: dict) -> tuple[tuple, tuple]:
    """(region, content) as (x, y, w, h): the source pixels resampled and where they land."""
    nw, nh = cfg["network_image_width"], cfg["network_image_height"]
    rx, ry, rw, rh = cfg["roi"] or (0, 0, src_w, src_h)
    assert rx + rw <= src_w and ry + rh <= src_h
    mode = cfg["resize_mode"]
    if mode == "stretch":
        return (rx, ry, rw, rh), (0, 0, nw, nh)
    if mode == "letterbox":
        s = min(nw / rw, nh / rh)
        cw = min(max(_round(rw * s), 1), nw)
        ch = min(max(_round(rh * s), 1), nh)
        if cfg["letterbox_anchor"] == "center":
            cx, cy = (nw - cw) // 2, (nh - ch) // 2
        else:
            cx, cy = 0, 0
        return (rx, ry, rw, rh), (cx, cy, cw, ch)
    assert mode == "center_crop", mode
    s = max(nw / rw, nh / rh)
    w = min(max(_round(nw * (1.0 / s)), 1), rw)
    h = min(max(_round(nh * (1.0 / s)), 1), rh)
    return (rx + (rw - w) // 2, ry + (rh - h) // 2, w, h), (0, 0, nw, nh)


def per_channel(values, c: int) -> float:
    return float(values[0] if len(values) == 1 else values[c])


def preprocess(data: bytes, encoding: str, width: int, height: int, step: int,
               big_endian: bool, config: dict) -> np.ndarray:
    """The tensor vision_preproc must produce, float64, in the output layout."""
    cfg = {**DEFAULTS, **config}
    ch = cfg["output_channels"]
    img = decode(data, encoding, width, height, step, big_endian, ch)
    (x, y, w, h), (cx, cy, cw, chh) = geometry(width, height, cfg)
    region = np.ascontiguousarray(img[y:y + h, x:x + w])
    interp = cv2.INTER_LINEAR if cfg["interpolation"] == "linear" else cv2.INTER_NEAREST
    resized = cv2.resize(region, (cw, chh), interpolation=interp)
    if resized.ndim == 2:
        resized = resized[..., None]
    nw, nh = cfg["network_image_width"], cfg["network_image_height"]
    pad_rgb = [per_channel(cfg["pad_value"], i) for i in range(3)]
    if ch == 1:
        # OpenCV 5's RGB2GRAY weights without integer rounding.
        pad = [(9798 * pad_rgb[0] + 19235 * pad_rgb[1] + 3735 * pad_rgb[2]) / 32768.0]
    else:
        pad = pad_rgb
    # copyMakeBorder on float64 planes so a fractional pad value stays exact.
    padded = cv2.copyMakeBorder(resized.astype(np.float64), cy, nh - cy - chh, cx,
                                nw - cx - cw, cv2.BORDER_CONSTANT, value=pad + [0.0] * (4 - ch))
    if padded.ndim == 2:
        padded = padded[..., None]
    if ch == 3 and cfg["channel_order"] == "bgr":
        padded = padded[..., ::-1]
    planes = np.empty((ch, nh, nw), np.float64)
    for c in range(ch):
        mean = per_channel(cfg["image_mean"], c)
        std = per_channel(cfg["image_stddev"], c)
        planes[c] = (padded[..., c] * cfg["pixel_scale"] - mean) / std
    conv = cfg.get("conv") or {}
    if conv.get("kernel", "none") != "none":
        from vptools import oracle_conv  # the conv2d oracle; imported only when needed

        planes = oracle_conv.apply_conv(planes, conv)
    if cfg["output_layout"] == "NCHW":
        return planes[None]
    return np.ascontiguousarray(planes.transpose(1, 2, 0))[None]


def expected_stretch(bgr: np.ndarray, w: int, h: int, mean, std) -> np.ndarray:
    """bgr8 -> RGB, stretch to w x h (cv2.resize INTER_LINEAR on float32), normalize, NCHW:
    the node's output for `resize_mode: stretch` and the default pixel_scale, in a few lines
    that do not go through `preprocess` (the ROS tests check the node with it)."""
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB).astype(np.float32)
    r = cv2.resize(rgb, (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float64)
    return ((r / 255.0 - np.array(mean)) / np.array(std)).transpose(2, 0, 1)[None]
