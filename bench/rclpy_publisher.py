#!/usr/bin/env python3
"""An rclpy camera publisher for the DDS benchmark (bench/bench_node.py --publisher rclpy):
8 frames of the test photographs scaled to WxH bgr8, published in a loop at --rate Hz
(0 = as fast as possible), each stamped with the time it is published, best effort
(sensor-data QoS, what camera drivers use).

Like a camera driver, it builds a new sensor_msgs/Image for every frame from the frame's
bytes (`msg.data = frame_bytes`: rclpy copies them into an array.array) and publishes it.
It prints `play: N images` like `vision_preproc play`, and how long building the message
and rclpy's publish() took (p50 / p99 / max; publish() converts the message to its C form
and serializes it into the Fast DDS shared-memory segment).

With --reliable it publishes reliable instead (the rclpy/rclcpp default QoS, depth 10);
with --camera-info TOPIC also a sensor_msgs/CameraInfo per frame, with the frame's stamp
(what camera drivers do); --count N stops after N frames; --frame-id names the frames.

Usage: rclpy_publisher.py --width 1280 --height 720 --rate 30 --seconds 20 --topic /ns/image
       [--wait-subscribers 1] [--reliable] [--camera-info /ns/camera_info] [--count N]
       (ROS_DOMAIN_ID and the Fast DDS profile variable from the env)
"""

from __future__ import annotations

import argparse
import sys
import time

import cv2
import numpy as np
import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image

from vptools.sources import PHOTOS, photo_rgb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--rate", type=float, default=30.0, help="Hz; 0 = as fast as possible")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--topic", default="image")
    ap.add_argument("--wait-subscribers", type=int, default=0)
    ap.add_argument("--reliable", action="store_true", help="publish reliable (default: best effort)")
    ap.add_argument("--camera-info", default="", help="also publish a CameraInfo per frame on this topic")
    ap.add_argument("--count", type=int, default=0, help="stop after this many frames (0: --seconds only)")
    ap.add_argument("--frame-id", default="camera")
    ap.add_argument("--wait-reliable-subscriber", action="store_true",
                    help="start once a reliable subscription of the topic exists (up to 20 s)")
    a = ap.parse_args()
    rclpy.init()
    node = rclpy.create_node("bench_rclpy_camera")
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE) if a.reliable else qos_profile_sensor_data
    pub = node.create_publisher(Image, a.topic, qos)
    info_pub = node.create_publisher(CameraInfo, a.camera_info, qos) if a.camera_info else None
    frames = []
    for i in range(8):
        rgb = cv2.resize(photo_rgb(PHOTOS[i % len(PHOTOS)]), (a.width, a.height), interpolation=cv2.INTER_CUBIC)
        frames.append(np.ascontiguousarray(rgb[..., ::-1]).tobytes())
    deadline = time.monotonic() + 20
    while pub.get_subscription_count() < a.wait_subscribers and time.monotonic() < deadline:
        time.sleep(0.05)
    while a.wait_reliable_subscriber and time.monotonic() < deadline and not any(
            i.qos_profile.reliability == ReliabilityPolicy.RELIABLE
            for i in node.get_subscriptions_info_by_topic(pub.topic_name)):
        time.sleep(0.05)
    period = 1.0 / a.rate if a.rate > 0 else 0.0
    pub_ms: list[float] = []
    build_ms: list[float] = []
    n = 0
    start = time.monotonic()
    next_t = start
    while time.monotonic() - start < a.seconds and not (a.count and n >= a.count):
        t = time.perf_counter()
        m = Image()
        m.header.frame_id = a.frame_id
        m.width, m.height, m.encoding, m.step = a.width, a.height, "bgr8", a.width * 3
        m.data = frames[n % len(frames)]
        ns = time.time_ns()
        m.header.stamp.sec, m.header.stamp.nanosec = ns // 10**9, ns % 10**9
        t1 = time.perf_counter()
        pub.publish(m)
        pub_ms.append((time.perf_counter() - t1) * 1e3)
        if info_pub is not None:
            info = CameraInfo()
            info.header = m.header
            info.width, info.height = a.width, a.height
            info.k = [a.width / 2.0, 0.0, a.width / 2.0, 0.0, a.width / 2.0, a.height / 2.0, 0.0, 0.0, 1.0]
            info_pub.publish(info)
        build_ms.append((t1 - t) * 1e3)
        n += 1
        if period:
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()  # behind: do not burst to catch up
    elapsed = time.monotonic() - start
    def stats(v: list[float]) -> str:
        s = sorted(v)
        return f"p50 {s[len(s) // 2]:.1f} p99 {s[min(len(s) - 1, int(0.99 * len(s)))]:.1f} max {s[-1]:.1f}"

    print(f"play: {n} images in {elapsed:.1f} s ({n / elapsed:.1f} Hz); message build ms {stats(build_ms)}; "
          f"rclpy publish() ms {stats(pub_ms)}", flush=True)
    if a.reliable:
        time.sleep(1.0)  # let the reliable writer deliver (and repair) its last samples
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
