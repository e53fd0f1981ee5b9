#!/usr/bin/env python3
"""The reference a user would otherwise run: a Python ROS 2 node (rclpy + OpenCV + NumPy)
doing the same preprocessing as vision_preproc's default letterbox configuration, with
the same topics and messages (image in; Tensor and FrameTiming out), so the DDS benchmark
can run both side by side. Its FrameTiming.total_us is callback entry -> after publishing
the tensor (what vision_preproc's total_us measures: receive -> publish).

The pipeline is the usual one (docs/BENCHMARKS.md, "typical"): cvtColor -> resize (uint8,
INTER_LINEAR) -> copyMakeBorder -> (x / 255 - mean) / std in float32 -> transpose (NCHW).

Usage: reference_node.py [--width 640 --height 480] (ROS args after --ros-args)
"""

from __future__ import annotations

import argparse
import sys
import time

import cv2
import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image
from vision_preproc_msgs.msg import FrameTiming, Tensor

DECODE = {"bgr8": cv2.COLOR_BGR2RGB, "rgb8": None}


class ReferenceNode(Node):
    def __init__(self, width: int, height: int) -> None:
        super().__init__("reference_preproc")
        self.w, self.h = width, height
        self.mean = np.array([0.5, 0.5, 0.5], np.float32)
        self.std = np.array([0.5, 0.5, 0.5], np.float32)
        out = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        self.tensor_pub = self.create_publisher(Tensor, "tensor", out)
        self.timing_pub = self.create_publisher(FrameTiming, "timing", out)
        self.create_subscription(Image, "image", self.on_image, qos_profile_sensor_data)
        self.seq = 0

    def on_image(self, msg: Image) -> None:
        t0 = time.perf_counter()
        img = np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.step)[:, : msg.width * 3]
        img = img.reshape(msg.height, msg.width, 3)
        code = DECODE[msg.encoding]
        rgb = cv2.cvtColor(img, code) if code is not None else img
        s = min(self.w / msg.width, self.h / msg.height)
        cw, ch = min(self.w, max(1, round(msg.width * s))), min(self.h, max(1, round(msg.height * s)))
        resized = cv2.resize(rgb, (cw, ch), interpolation=cv2.INTER_LINEAR)
        left, top = (self.w - cw) // 2, (self.h - ch) // 2
        padded = cv2.copyMakeBorder(resized, top, self.h - ch - top, left, self.w - cw - left,
                                    cv2.BORDER_CONSTANT, value=(0, 0, 0))
        norm = (padded.astype(np.float32) * np.float32(1 / 255) - self.mean) / self.std
        chw = np.ascontiguousarray(norm.transpose(2, 0, 1))
        t1 = time.perf_counter()
        t = Tensor()
        t.header = msg.header
        t.name, t.layout, t.dtype = "input", "NCHW", "float32"
        t.shape = [1, 3, self.h, self.w]
        t.data = chw.tobytes()
        t.scale_x, t.scale_y = cw / msg.width, ch / msg.height
        t.offset_x, t.offset_y = float(left), float(top)
        t.source_width, t.source_height, t.source_encoding = msg.width, msg.height, msg.encoding
        self.tensor_pub.publish(t)
        t2 = time.perf_counter()
        timing = FrameTiming()
        timing.header = msg.header
        timing.sequence = self.seq
        timing.backend = "python-opencv"
        timing.preprocess_us = (t1 - t0) * 1e6
        timing.total_us = (t2 - t0) * 1e6
        now = time.time_ns()
        stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
        timing.age_us = (now - stamp) / 1e3
        self.timing_pub.publish(timing)
        self.seq += 1


def main() -> int:
    args, ros_args = argparse.ArgumentParser(add_help=True), None
    args.add_argument("--width", type=int, default=640)
    args.add_argument("--height", type=int, default=480)
    argv = sys.argv[1:]
    if "--ros-args" in argv:
        i = argv.index("--ros-args")
        argv, ros_args = argv[:i], argv[i:]
    a = args.parse_args(argv)
    rclpy.init(args=["reference_node"] + (ros_args or []))
    node = ReferenceNode(a.width, a.height)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
