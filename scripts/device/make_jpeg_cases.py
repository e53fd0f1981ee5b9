#!/usr/bin/env python3
"""The JPEG cases of test/gpu_nvjpeg.rs and the input of `bench-decode`, from the
photographs of test/data (provenance in test/data/README.md), with OpenCV (libjpeg-turbo)
and Pillow: what cameras and image_transport publish, beyond the baseline 4:4:4 that the
test encodes itself with the `image` crate.

    python3 scripts/device/make_jpeg_cases.py OUT_DIR

Writes OUT_DIR/<name>.jpg: per colour photograph 4:2:0 at quality 50/80/90/95, 4:2:2 and
4:4:4 at 90, progressive 4:2:0 at 90, Pillow 4:2:0 at 85; the grey photograph at 80; and
mosaic_1080p_q90 / _q80 (4:2:0) and mosaic_720p_q80_422: a 1920x1080 frame tiled from the
photographs at their own scale (test/data holds no 1080p photograph; an upscaled one would
be smoother, and so faster to decode, than a camera's frame).
"""
import io
import sys
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from vptools.compressed import cv_jpeg

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "test" / "data"
COLOUR = ["astronaut", "chelsea", "coffee", "rocket"]
def load(name: str) -> np.ndarray:
    path = DATA / (f"{name}.jpg" if name == "rocket" else f"{name}.png")
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return img


def mosaic(width: int, height: int) -> np.ndarray:
    """A width x height BGR frame tiled row by row from the photographs (every other tile
    mirrored), at their own resolution."""
    tiles = [load(n) for n in COLOUR] + [cv2.cvtColor(load("camera"), cv2.COLOR_GRAY2BGR)]
    out = np.zeros((height, width, 3), np.uint8)
    y, k = 0, 0
    while y < height:
        x, row_h = 0, 0
        while x < width:
            t = tiles[k % len(tiles)]
            if k % 2:
                t = t[:, ::-1]
            h, w = min(t.shape[0], height - y), min(t.shape[1], width - x)
            out[y:y + h, x:x + w] = t[:h, :w]
            x, row_h, k = x + w, max(row_h, h), k + 1
        y += row_h
    return out


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in COLOUR:
        img = load(name)
        for q in (50, 80, 90, 95):
            files[f"cv2_{name}_q{q}_420"] = cv_jpeg(img, q, "420", False)
        files[f"cv2_{name}_q90_422"] = cv_jpeg(img, 90, "422", False)
        files[f"cv2_{name}_q90_444"] = cv_jpeg(img, 90, "444", False)
        files[f"cv2_{name}_q90_progressive"] = cv_jpeg(img, 90, "420", True)
        buf = io.BytesIO()
        Image.fromarray(cv2.cvtColor(img, cv2.COLOR_BGR2RGB)).save(buf, "JPEG", quality=85)
        files[f"pil_{name}_q85_420"] = buf.getvalue()
    files["cv2_camera_q80_grey"] = cv_jpeg(load("camera"), 80, "420", False)
    frame = mosaic(1920, 1080)
    files["mosaic_1080p_q90"] = cv_jpeg(frame, 90, "420", False)
    files["mosaic_1080p_q80"] = cv_jpeg(frame, 80, "420", False)
    files["mosaic_720p_q80_422"] = cv_jpeg(cv2.resize(frame[:, 240:1680], (1280, 720), interpolation=cv2.INTER_AREA), 80, "422", False)
    for name, data in files.items():
        (out / f"{name}.jpg").write_bytes(data)
    print(f"{len(files)} JPEG cases in {out} ({sum(map(len, files.values())) // 1024} KiB); "
          f"mosaic_1080p_q90: {len(files['mosaic_1080p_q90']) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
