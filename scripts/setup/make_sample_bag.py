#!/usr/bin/env python3
"""Write the demo's sample bag: real photographs from test/data (provenance in
test/data/README.md) as a camera would send them in five encodings, with camera_info,
at 30 Hz, written by the `rosbags` library (rosbag2 MCAP). Called by scripts/setup/setup.sh.

Usage: make_sample_bag.py OUT_DIR
"""

import shutil
import sys
from pathlib import Path

from vptools.bags import write_bag
from vptools.sources import photo_frame

FRAMES = [
    ("bgr8", "chelsea.png"),
    ("yuyv", "coffee.png"),
    ("nv12", "astronaut.png"),
    ("bayer_rggb8", "rocket.jpg"),
    ("mono8", "camera.png"),
]


def main() -> int:
    out = Path(sys.argv[1])
    if out.exists():
        shutil.rmtree(out)
    frames = [photo_frame(enc, photo) for enc, photo in FRAMES]
    write_bag(out, frames, storage="mcap", topic="/camera/image_raw", period_ns=33_333_333)
    print(f"[setup] sample bag: {out} ({len(frames)} frames: {', '.join(e for e, _ in FRAMES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
