"""Compressed payloads for the tests of compressed inputs: photographs of test/data encoded
by OpenCV and Pillow (JPEG at a quality, a chroma subsampling, baseline or progressive;
PNG), MJPEG frames without Huffman tables, headers that declare another size; and our own
decoder's pixels (`vision_preproc decode-file`, `compressed::decode` alone) and OpenCV's
(`cv2.imdecode`) for the same payload."""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from vptools import DATA, HOOKS_BIN_DIR

try:
    from PIL import Image
except ImportError:  # Pillow is optional: its cases are skipped without it.
    Image = None

#: `decode-file` is in the CLI built with the `bench` feature (scripts/test_hooks_build.sh).
BIN = HOOKS_BIN_DIR / "vision_preproc"
SAMPLING = {
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
}


@dataclass
class Payload:
    """One `sensor_msgs/CompressedImage`'s `format` and `data` (vptools.bags writes them)."""
    format: str
    data: bytes


def photo(name: str, grey: bool = False) -> np.ndarray:
    img = cv2.imread(str(DATA / name), cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR)
    assert img is not None, name
    return img


def cv_jpeg(bgr_or_grey: np.ndarray, quality: int, sampling: str, progressive: bool) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    if bgr_or_grey.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, SAMPLING[sampling]]
    ok, buf = cv2.imencode(".jpg", bgr_or_grey, params)
    assert ok
    return buf.tobytes()


def cv_png(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return buf.tobytes()


def pil_jpeg(name: str, quality: int, subsampling: int, progressive: bool, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.open(DATA / name).convert(mode).save(
        out, "JPEG", quality=quality, subsampling=subsampling, progressive=progressive)
    return out.getvalue()


def without_huffman_tables(jpeg: bytes) -> bytes:
    """The JPEG without its DHT segments (before the first scan), as MJPEG cameras send."""
    out, pos = bytearray(jpeg[:2]), 2
    while jpeg[pos + 1] != 0xDA:
        length = int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if jpeg[pos + 1] != 0xC4:
            out += jpeg[pos:pos + 2 + length]
        pos += 2 + length
    assert len(out) < pos, "no DHT segment removed"
    return bytes(out + jpeg[pos:])


def reference(payload: bytes) -> np.ndarray:
    """OpenCV's decode, as RGB (colour) or 2-D (grey), 16-bit kept."""
    img = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED)
    assert img is not None
    if img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA if img.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    return img


def run_decoder(binary: Path, tmp: Path, fmt: str, payload: bytes) -> tuple[int, dict, bytes]:
    src, dst = tmp / "in.bin", tmp / "out.raw"
    src.write_bytes(payload)
    dst.unlink(missing_ok=True)
    proc = subprocess.run([str(binary), "decode-file", "--format", fmt, str(src), str(dst)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 2), f"decode-file crashed ({proc.returncode}): {proc.stderr}"
    head = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc.returncode, head, dst.read_bytes() if proc.returncode == 0 else b""


CHANNELS = {"rgb8": (3, np.uint8), "rgba8": (4, np.uint8), "mono8": (1, np.uint8),
            "mono16": (1, "<u2"), "rgb16": (3, "<u2")}


def decoded(binary: Path, tmp: Path, fmt: str, payload: bytes) -> tuple[str, np.ndarray]:
    rc, head, raw = run_decoder(binary, tmp, fmt, payload)
    assert rc == 0, f"{fmt}: {head}"
    channels, dtype = CHANNELS[head["encoding"]]
    arr = np.frombuffer(raw, dtype).reshape(head["height"], head["width"], channels)
    assert head["step"] == head["width"] * channels * arr.itemsize
    return head["encoding"], arr[..., 0] if channels == 1 else arr



def with_declared_size(payload: bytes, width: int, height: int) -> bytes:
    b = bytearray(payload)
    if b.startswith(b"\x89PNG"):
        b[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    else:
        sof = b.find(b"\xff\xc0")
        assert sof > 0
        b[sof + 5:sof + 9] = min(height, 65535).to_bytes(2, "big") + min(width, 65535).to_bytes(2, "big")
    return bytes(b)
