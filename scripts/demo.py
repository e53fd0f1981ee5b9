#!/usr/bin/env python3
"""`make demo`: the node against a built-in frame source, no camera needed.

Starts vision_preproc_node (backend auto: the GPU when one is usable, else the CPU),
publishes the repository's test photographs (test/data/, real photos) as bgr8
sensor_msgs/Image at camera rate, and prints a live per-second summary of what comes
back on `timing`. Stops by itself after --seconds, or on Ctrl-C.

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
# The built-in camera publishes large best-effort frames: the same Fast DDS profile the
# README asks camera drivers to use.
os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(ROOT / "config" / "fastdds_large_frames.xml"))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming, Tensor  # noqa: E402


def load_frames() -> list[np.ndarray]:
    frames = []
    for name in ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg"]:
        img = cv2.imread(str(ROOT / "test" / "data" / name), cv2.IMREAD_COLOR)
        if img is None:
            sys.exit(f"demo: cannot read test/data/{name}")
        frames.append(img)
    return frames


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="run time (default 8)")
    ap.add_argument("--rate", type=float, default=30.0, help="camera rate in Hz (default 30)")
    ap.add_argument("--params-file", default=str(ROOT / "config" / "default.yaml"))
    args = ap.parse_args()

    node_bin = ROOT / "target" / "release" / "vision_preproc_node"
    print(f"demo: starting {node_bin.name} (ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']}, "
          f"params {Path(args.params_file).name})", flush=True)
    node = subprocess.Popen([str(node_bin), "--ros-args", "--params-file", args.params_file, "-r", "__ns:=/demo"])

    rclpy.init()
    peer = rclpy.create_node("demo_camera", namespace="/demo")
    pub = peer.create_publisher(Image, "image", qos_profile_sensor_data)
    window: list[FrameTiming] = []
    shapes: list[str] = []
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    peer.create_subscription(FrameTiming, "timing", window.append, reliable)
    peer.create_subscription(
        Tensor, "tensor", lambda t: shapes.append(f"{t.name} {list(t.shape)} {t.layout} {t.dtype}"), reliable
    )

    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    frames = load_frames()
    period = 1.0 / args.rate
    start = time.monotonic()
    deadline = start + args.seconds
    next_frame = start
    next_report = start + 1.0
    sent = received = 0
    i = 0
    print(f"demo: publishing {len(frames)} real photographs as bgr8 at {args.rate:g} Hz on /demo/image "
          f"for {args.seconds:g} s (Ctrl-C stops)", flush=True)
    while not stop and time.monotonic() < deadline and node.poll() is None:
        now = time.monotonic()
        if now >= next_frame:
            img = frames[i % len(frames)]
            msg = Image()
            t = time.time_ns()
            msg.header.stamp.sec, msg.header.stamp.nanosec = t // 10**9, t % 10**9
            msg.header.frame_id = "demo_camera"
            msg.height, msg.width = img.shape[:2]
            msg.encoding, msg.step = "bgr8", img.shape[1] * 3
            msg.data = img.tobytes()
            pub.publish(msg)
            sent += 1
            i += 1
            next_frame += period
        if now >= next_report:
            w, window[:] = list(window), []
            received += len(w)
            if w:
                pre = [t.preprocess_us / 1000 for t in w]
                tot = [t.total_us / 1000 for t in w]
                dropped = sum(t.dropped_since_last for t in w)
                print(f"[{now - start:4.1f}s] {len(w):3d} fps  backend {w[-1].backend:4s}  "
                      f"preprocess p50 {pct(pre, 50):6.2f} ms p99 {pct(pre, 99):6.2f} ms  "
                      f"receive->publish p50 {pct(tot, 50):6.2f} ms p99 {pct(tot, 99):6.2f} ms  "
                      f"dropped {dropped}", flush=True)
            else:
                print(f"[{now - start:4.1f}s] waiting for the node ...", flush=True)
            next_report += 1.0
        rclpy.spin_once(peer, timeout_sec=max(0.0, min(next_frame, next_report) - time.monotonic()))
    received += len(window)
    if node.poll() is None:
        node.send_signal(signal.SIGINT)
    rc = node.wait(timeout=10)
    peer.destroy_node()
    rclpy.shutdown()
    if shapes:
        print(f"demo: last tensor: {shapes[-1]}")
    print(f"demo: sent {sent} frames, received {received} timings; node exited with {rc}")
    return 0 if rc == 0 and received > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
