"""Raw frames of every encoding, derived from the real photographs in test/data with
OpenCV (like a camera driver would produce them), with an optional padded row stride.

    rgb8/bgr8/rgba8/bgra8  the photo's bytes (alpha: noise, which must be ignored)
    mono8                  camera.png, or COLOR_RGB2GRAY of a colour photo
    mono16/rgb16/bgr16     value * 257 + noise in 0..256 (so v / 257 is not an integer),
                           little- or big-endian
    yuyv / uyvy            COLOR_RGB2YUV_YUY2 / COLOR_RGB2YUV_UYVY
    nv12 / nv21            COLOR_RGB2YUV_I420, chroma planes interleaved (U V / V U)
    bayer_*8               the photo subsampled through the 2x2 colour filter pattern
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cv2
import numpy as np

from vptools import DATA

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg")

ALL_ENCODINGS = (
    "rgb8", "bgr8", "rgba8", "bgra8", "mono8", "mono16", "rgb16", "bgr16",
    "yuyv", "uyvy", "nv12", "nv21",
    "bayer_rggb8", "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8",
)


@dataclass
class Frame:
    data: bytes
    encoding: str
    width: int
    height: int
    step: int
    big_endian: bool = False

    def cli_args(self) -> list[str]:
        args = ["--raw", "--encoding", self.encoding, "--width", str(self.width),
                "--height", str(self.height), "--step", str(self.step)]
        return args + (["--big-endian"] if self.big_endian else [])


@functools.lru_cache(maxsize=None)
def photo_bgr(name: str) -> np.ndarray:
    """(H, W, 3) uint8 BGR of a test photograph, as cv2.imread reads it."""
    img = cv2.imread(str(DATA / name), cv2.IMREAD_COLOR)
    assert img is not None, name
    return img


@functools.lru_cache(maxsize=None)
def photo_rgb(name: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB of a test photograph (grey ones are read as grey, then RGB)."""
    img = cv2.imread(str(DATA / name), cv2.IMREAD_COLOR)
    assert img is not None, name
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


@functools.lru_cache(maxsize=None)
def photo_grey(name: str) -> np.ndarray:
    img = cv2.imread(str(DATA / name), cv2.IMREAD_GRAYSCALE)
    assert img is not None, name
    return img


def _noise(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint16)


def _pad_rows(plane: np.ndarray, step: int, seed: int) -> bytes:
    """Rows of `plane` (n, row_bytes) uint8 padded with noise to `step` bytes."""
    n, row_bytes = plane.shape
    assert step >= row_bytes
    out = np.random.default_rng(seed).integers(0, 256, (n, step), dtype=np.uint8)
    out[:, :row_bytes] = plane
    return out.tobytes()


def make_frame(encoding: str, rgb: np.ndarray, pad: int = 0, big_endian: bool = False,
               grey: np.ndarray | None = None, seed: int = 1) -> Frame:
    """A frame of `encoding` from an (H, W, 3) uint8 RGB image (even sizes for yuv/nv),
    with `pad` extra bytes at the end of every row."""
    h, w = rgb.shape[:2]
    if encoding in ("rgb8", "bgr8"):
        px = rgb if encoding == "rgb8" else rgb[..., ::-1]
        plane = np.ascontiguousarray(px).reshape(h, w * 3)
    elif encoding in ("rgba8", "bgra8"):
        px = rgb if encoding == "rgba8" else rgb[..., ::-1]
        alpha = _noise((h, w, 1), seed).astype(np.uint8)
        plane = np.concatenate([px, alpha], axis=2).reshape(h, w * 4)
    elif encoding == "mono8":
        plane = grey if grey is not None else cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    elif encoding in ("mono16", "rgb16", "bgr16"):
        if encoding == "mono16":
            base = grey if grey is not None else cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
        else:
            base = rgb if encoding == "rgb16" else np.ascontiguousarray(rgb[..., ::-1])
        v = np.minimum(base.astype(np.uint32) * 257 + _noise(base.shape, seed), 65535)
        v = v.astype(">u2" if big_endian else "<u2")
        plane = v.view(np.uint8).reshape(h, -1)
    elif encoding in ("yuyv", "yuv422_yuy2", "uyvy", "yuv422"):
        code = cv2.COLOR_RGB2YUV_YUY2 if encoding in ("yuyv", "yuv422_yuy2") else cv2.COLOR_RGB2YUV_UYVY
        plane = cv2.cvtColor(rgb, code).reshape(h, w * 2)
    elif encoding in ("nv12", "nv21"):
        # I420 is a flat buffer: Y (h*w), then U and V planes of (h/2)*(w/2) each.
        i420 = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420).ravel()
        q = (h // 2) * (w // 2)
        y = i420[:h * w].reshape(h, w)
        u = i420[h * w:h * w + q].reshape(h // 2, w // 2)
        v = i420[h * w + q:].reshape(h // 2, w // 2)
        first, second = (u, v) if encoding == "nv12" else (v, u)
        chroma = np.stack([first, second], axis=2).reshape(h // 2, w)
        plane = np.concatenate([y, chroma], axis=0)
    elif encoding.startswith("bayer_"):
        pattern = encoding[6:10]  # e.g. "rggb": colours of (0,0) (0,1) (1,0) (1,1)
        index = {"r": 0, "g": 1, "b": 2}
        plane = np.empty((h, w), np.uint8)
        for k, (dy, dx) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            plane[dy::2, dx::2] = rgb[dy::2, dx::2, index[pattern[k]]]
    else:
        raise ValueError(encoding)
    plane = np.ascontiguousarray(plane, dtype=np.uint8)
    step = plane.shape[1] + pad
    return Frame(_pad_rows(plane, step, seed + 7), encoding, w, h, step, big_endian)


def photo_frame(encoding: str, photo: str = "chelsea.png", size: tuple | None = None,
                crop: tuple | None = None, **kw) -> Frame:
    """A frame of `encoding` from a photograph, optionally cropped `(x, y, w, h)` and/or
    resized to `size` (w, h) with INTER_AREA first (sizes made even where the encoding
    needs it)."""
    is_grey = photo == "camera.png"
    img = photo_grey(photo) if is_grey else photo_rgb(photo)
    if crop:
        x, y, w, h = crop
        img = img[y:y + h, x:x + w]
    if size:
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    h, w = img.shape[:2]
    if encoding in ("yuyv", "uyvy", "yuv422_yuy2", "yuv422", "nv12", "nv21"):
        w -= w % 2
        if encoding.startswith("nv"):
            h -= h % 2
    img = np.ascontiguousarray(img[:h, :w])
    if is_grey:
        return make_frame(encoding, cv2.cvtColor(img, cv2.COLOR_GRAY2RGB), grey=img, **kw)
    return make_frame(encoding, img, **kw)


def camera_frames_bgr8(w: int, h: int, n: int = len(PHOTOS)) -> list[Frame]:
    """n camera-like bgr8 frames: the photographs of PHOTOS in turn, scaled to w x h with
    INTER_CUBIC (the inputs of the soak, the node benchmarks and the GPU node runs)."""
    frames = []
    for i in range(n):
        rgb = cv2.resize(photo_rgb(PHOTOS[i % len(PHOTOS)]), (w, h), interpolation=cv2.INTER_CUBIC)
        bgr = np.ascontiguousarray(rgb[..., ::-1])
        frames.append(Frame(bgr.tobytes(), "bgr8", w, h, w * 3))
    return frames
