#!/usr/bin/env python3
"""Input bags for the node on the GPU machine (scripts/device/gpu_node_remote.py): 4 real
photographs (test/data) scaled to 1280x720 and to 1920x1080 (INTER_CUBIC), bgr8, 30 Hz,
the same frames bench/bench_node.py uses on this machine (its first four); and the 1080p
frames as JPEG q90 (sensor_msgs/CompressedImage, `compressed`'s bag, bench_handoff.py's
path c); packed as .device/node_bags.tar.xz (the GPU machine cannot build bags: no
rosbags there).

Usage: python3 scripts/device/gpu_node_bags.py [STAGE_DIR]   (default .device)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from vptools import ROOT
from vptools.bags import write_bag
from vptools.node_scenarios import JPEG_BAG
from vptools.soak import make_jpeg_bag
from vptools.sources import camera_frames_bgr8


def main() -> None:
    stage = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".device"
    stage.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for w, h in ((1280, 720), (1920, 1080)):
            write_bag(Path(tmp) / f"bgr8_{w}x{h}", camera_frames_bgr8(w, h), storage="mcap", with_camera_info=False)
        make_jpeg_bag(Path(tmp) / JPEG_BAG, 1920, 1080, 30.0)
        out = stage / "node_bags.tar.xz"
        subprocess.run(["tar", "cJf", str(out), "-C", tmp, "bgr8_1280x720", "bgr8_1920x1080", JPEG_BAG], check=True)
    print(f"{out}: {out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
