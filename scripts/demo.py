#!/usr/bin/env python3
"""`make demo`: the node fed by a recorded camera, no camera needed.

Plays the sample bag (.ros/sample_bag: real photographs from test/data as a camera
sends them, in bgr8, yuyv, nv12, bayer_rggb8 and mono8, with camera_info; written by
scripts/setup/setup.sh) into vision_preproc_node in a loop at camera rate with `vision_preproc
play`, and prints a live per-second summary of what comes back: fps, p50/p99 of each
stage, the backend (the GPU when one is usable, else the CPU), and drops. Previews of what
the network sees (the node's debug_image, one per source encoding) are written to
out/demo/. Stops by itself after --seconds, or on Ctrl-C.

Runs on its own ROS_DOMAIN_ID, on loopback only.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(101, 199)))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming, Tensor  # noqa: E402

STAGES = ("upload_us", "preprocess_us", "conv_us", "download_us", "total_us")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="run time (default 8)")
    ap.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1: 30 Hz)")
    ap.add_argument("--bag", default=str(ROOT / ".ros" / "sample_bag"))
    ap.add_argument("--params-file", default=str(ROOT / "config" / "default.yaml"))
    ap.add_argument("--out", default=str(ROOT / "out" / "demo"))
    args = ap.parse_args()

    bin_dir = ROOT / "target" / "release"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"demo: ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']}, parameters {Path(args.params_file).name}, "
          f"bag {args.bag}", flush=True)
    node = subprocess.Popen([str(bin_dir / "vision_preproc_node"), "--ros-args", "--params-file", args.params_file,
                             "-p", "debug_image_rate:=30.0", "-r", "__ns:=/demo"])

    rclpy.init()
    peer = rclpy.create_node("demo_monitor", namespace="/demo")
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    window: list[FrameTiming] = []
    encodings: dict[int, str] = {}
    last_tensor: list[str] = []
    saved: dict[str, Path] = {}

    def on_tensor(t: Tensor) -> None:
        encodings[t.header.stamp.sec * 10**9 + t.header.stamp.nanosec] = t.source_encoding
        last_tensor[:] = [f"{t.name} {list(t.shape)} {t.layout} {t.dtype}"]

    def on_debug(img: Image) -> None:
        enc = encodings.get(img.header.stamp.sec * 10**9 + img.header.stamp.nanosec, "unknown")
        px = np.frombuffer(bytes(img.data), np.uint8).reshape(img.height, img.width, -1)
        path = out / f"network_view_{enc}.png"
        cv2.imwrite(str(path), cv2.cvtColor(px, cv2.COLOR_RGB2BGR) if px.shape[2] == 3 else px)
        saved[enc] = path

    peer.create_subscription(FrameTiming, "timing", window.append, reliable)
    peer.create_subscription(Tensor, "tensor", on_tensor, reliable)
    peer.create_subscription(Image, "debug_image", on_debug, reliable)

    player = subprocess.Popen([str(bin_dir / "vision_preproc"), "play", args.bag, "--loop", "--rate", str(args.rate),
                               "--image-topic", "/demo/image", "--camera-info-topic", "/demo/camera_info",
                               "--wait-subscribers", "1"], stdout=subprocess.DEVNULL)
    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    start = time.monotonic()
    next_report = start + 1.0
    received = 0
    print(f"demo: playing the sample bag in a loop at camera rate into /demo/image for {args.seconds:g} s "
          "(Ctrl-C stops)", flush=True)
    print("        fps  backend  " + "  ".join(f"{s[:-3]:>10s} p50/p99 ms" for s in STAGES) + "  dropped", flush=True)
    while not stop and time.monotonic() < start + args.seconds and node.poll() is None:
        rclpy.spin_once(peer, timeout_sec=0.05)
        now = time.monotonic()
        if now >= next_report:
            w, window[:] = list(window), []
            received += len(w)
            if w:
                cols = "  ".join(f"{pct([getattr(t, s) for t in w], 50) / 1000:7.2f}/{pct([getattr(t, s) for t in w], 99) / 1000:<7.2f}"
                                 .rjust(21) for s in STAGES)
                print(f"[{now - start:4.1f}s] {len(w):4d}  {w[-1].backend:7s}  {cols}  {sum(t.dropped_since_last for t in w):7d}",
                      flush=True)
            else:
                print(f"[{now - start:4.1f}s] waiting for frames ...", flush=True)
            next_report += 1.0
    for p in (player, node):
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    player.wait(timeout=10)
    # Keep listening until the node is gone: the tensor of the frame in flight at the
    # signal still arrives (the node publishes it before exiting).
    deadline = time.monotonic() + 10
    while node.poll() is None and time.monotonic() < deadline:
        rclpy.spin_once(peer, timeout_sec=0.05)
    rc = node.wait(timeout=10)
    received += len(window)
    peer.destroy_node()
    rclpy.shutdown()
    if last_tensor:
        print(f"demo: last tensor: {last_tensor[0]}")
    for enc, path in sorted(saved.items()):
        print(f"demo: preview of what the network sees ({enc}): {path}")
    print(f"demo: {received} tensors received; node exited with {rc}")
    return 0 if rc == 0 and received > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
