"""Harness for tests through real ROS 2: the node runs as its own process, rclpy is the
independent peer in this process, and DDS carries everything in between.

Every test run gets its own ROS_DOMAIN_ID and stays on loopback
(ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST); every wait has a timeout.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vptools import ROOT
from vptools.fastdds import PROFILE_VARS, profile_var, with_profile
# The node as a process (callers import these from here).
from vptools.procs import (DEFERRED_CPU_ENV, FAULT_INJECTION_NODE, INJECT_FAULT_ENV, NODE_BIN,  # noqa: F401
                           TEST_HOOK_ENVS, NodeProcess)
from vptools.tolerances import tensor_array  # noqa: F401 (callers import it from here)


# One domain for this test run (set before rclpy is imported anywhere), loopback only. With
# pytest-xdist (scripts/test.sh runs the ROS tests in workers) each worker gets its own: the
# run's domain (chosen by the first process that imports this, pytest's controller, whose
# environment the workers inherit) plus the worker's number.
os.environ.setdefault("VPTOOLS_ROS_DOMAIN", os.environ.get("ROS_DOMAIN_ID")
                      or str(random.Random(os.getpid() ^ int(time.time())).randint(1, 90)))
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
os.environ["ROS_DOMAIN_ID"] = str(int(os.environ["VPTOOLS_ROS_DOMAIN"])
                                  + (int(_worker[2:]) if _worker[2:].isdigit() else 0))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
# The peer publishes large best-effort images: use the Fast DDS profile the README tells
# camera drivers to use (a large shared-memory segment; see config/fastdds_large_frames.xml),
# under the name the installed Fast DDS reads (Jazzy's 2.14 ignores the other one).
os.environ.setdefault(profile_var(), str(ROOT / "config" / "fastdds_large_frames.xml"))

import rclpy  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy, qos_profile_sensor_data  # noqa: E402
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming, Tensor, TensorBatch  # noqa: E402

RELIABLE = QoSProfile(reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST, depth=10)
BEST_EFFORT = qos_profile_sensor_data


PUBLISHER = ROOT / "bench" / "rclpy_publisher.py"
PROFILE = ROOT / "config" / "fastdds_large_frames.xml"


def stock_env(profile: bool = False) -> dict:
    """This process's environment for a camera or node: without a Fast DDS profile unless
    `profile` (then the shipped camera profile)."""
    return with_profile(dict(os.environ), PROFILE if profile else None)


class Camera:
    """bench/rclpy_publisher.py in its own process (a stock camera: no Fast DDS profile
    unless `profile`, or exactly the environment `env`), publishing on `<ns>/image`."""

    def __init__(self, ns: str, *args: str, profile: bool = False, frame_id: str = "camera",
                 env: dict | None = None):
        self.cmd = [sys.executable, str(PUBLISHER), "--topic", f"{ns}/image", "--frame-id", frame_id, *args]
        self.proc = subprocess.Popen(self.cmd, env=env if env is not None else stock_env(profile),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def sent(self, timeout: float = 60.0) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out
        assert "play: " in out, out
        return int(out.split("play: ")[1].split(" images")[0])

    def stop(self) -> None:
        """SIGINT, as `ros2 launch` stops a process (rclpy then removes its Fast DDS
        shared-memory files); SIGKILL after 5 s. A SIGKILLed camera leaves its files in
        /dev/shm (docs/RELIABILITY.md, *Shutdown*)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def frame_msg(frame, stamp_ns: int, frame_id: str) -> Image:
    """A sensor_msgs/Image of a vptools.sources.Frame (its bytes, encoding and step as they are)."""
    msg = Image()
    msg.header.stamp.sec, msg.header.stamp.nanosec = stamp_ns // 1_000_000_000, stamp_ns % 1_000_000_000
    msg.header.frame_id = frame_id
    msg.height, msg.width, msg.encoding, msg.is_bigendian, msg.step = (
        frame.height, frame.width, frame.encoding, int(frame.big_endian), frame.step)
    msg.data = frame.data
    return msg


def image_msg(pixels: np.ndarray, encoding: str, stamp_ns: int, frame_id: str, step_pad: int = 0) -> Image:
    """A sensor_msgs/Image of `pixels` (H, W[, C]) with `step_pad` extra bytes per row."""
    h, w = pixels.shape[:2]
    row = pixels.reshape(h, -1).view(np.uint8)
    if step_pad:
        row = np.concatenate([row, np.full((h, step_pad), 0xAB, np.uint8)], axis=1)
    msg = Image()
    msg.header.stamp.sec = stamp_ns // 1_000_000_000
    msg.header.stamp.nanosec = stamp_ns % 1_000_000_000
    msg.header.frame_id = frame_id
    msg.height, msg.width = h, w
    msg.encoding = encoding
    msg.is_bigendian = 0
    msg.step = row.shape[1]
    msg.data = np.ascontiguousarray(row).tobytes()
    return msg


def stamp_ns(header) -> int:
    return header.stamp.sec * 1_000_000_000 + header.stamp.nanosec


@dataclass
class Peer:
    """An rclpy node publishing images and recording tensors and timings."""

    ns: str
    image_qos: QoSProfile = field(default_factory=lambda: BEST_EFFORT)
    output_qos: QoSProfile = field(default_factory=lambda: RELIABLE)
    # False: no image publisher (for tests whose cameras run elsewhere).
    publish_images: bool = True
    # "compressed": the image publisher is image_transport's compressed one
    # (sensor_msgs/CompressedImage on `image/compressed`).
    transport: str = "raw"
    # True: the node batches (2+ inputs): `tensors` holds its TensorBatch messages.
    batch: bool = False

    def __post_init__(self) -> None:
        self.closed = False
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node(f"peer_{os.getpid()}", namespace=self.ns, context=self.context)
        kind, topic = (CompressedImage, "image/compressed") if self.transport == "compressed" else (Image, "image")
        self.pub = self.node.create_publisher(kind, topic, self.image_qos) if self.publish_images else None
        self.tensors: list[Tensor] = []
        self.timings: list[FrameTiming] = []
        self.node.create_subscription(TensorBatch if self.batch else Tensor, "tensor", self.tensors.append,
                                      self.output_qos)
        self.node.create_subscription(FrameTiming, "timing", self.timings.append, self.output_qos)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def spin_until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            self.executor.spin_once(timeout_sec=0.05)

    def wait_connected(self, timeout: float = 20.0) -> None:
        """Until the node's image subscription and our output subscriptions are matched."""
        tensor_topic = f"{self.ns}/tensor".replace("//", "/")
        self.spin_until(
            lambda: self.pub.get_subscription_count() >= 1
            and self.node.count_publishers(tensor_topic) >= 1,
            timeout,
            "the node to appear on DDS",
        )

    def send_until_received(self, msg: Image | CompressedImage, timeout: float = 15.0, resend: float = 1.0) -> Tensor:
        """Publish `msg` (again every `resend` s: best effort may drop) until a tensor with
        its stamp arrives; return that tensor."""
        want = stamp_ns(msg.header)
        deadline = time.monotonic() + timeout
        while True:
            self.pub.publish(msg)
            until = min(deadline, time.monotonic() + resend)
            while time.monotonic() < until:
                self.executor.spin_once(timeout_sec=0.05)
                for t in self.tensors:
                    if stamp_ns(t.header) == want:
                        return t
            if time.monotonic() >= deadline:
                raise AssertionError(f"no tensor for stamp {want} within {timeout} s")

    def timing_for(self, stamp: int, timeout: float = 5.0) -> FrameTiming:
        found: list[FrameTiming] = []

        def have() -> bool:
            found[:] = [t for t in self.timings if stamp_ns(t.header) == stamp]
            return bool(found)

        self.spin_until(have, timeout, f"FrameTiming for stamp {stamp}")
        return found[0]

    def close(self) -> None:
        """Shut the peer down (once: later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def status_values(status) -> dict[str, str]:
    """A diagnostic_msgs/DiagnosticStatus's key/values as a dict."""
    return {v.key: v.value for v in status.values}


def frame_counts(status) -> dict[str, int]:
    """The node's frame counters of a status (its keys starting with `Frames`)."""
    return {k: int(v) for k, v in status_values(status).items() if k.startswith("Frames")}


def call(peer: Peer, srv_type, name: str, request, timeout: float = 10.0, attempts: int = 3, client=None):
    """Call service `name` of type `srv_type` from the peer and return the reply (every
    wait with a timeout). A request whose reply does not come within `timeout` is sent
    again, up to `attempts` times: a reply to a client created just before the call can be
    lost when the server has not matched the client's reply reader yet (discovery is slow
    under load; seen once: no get_parameters reply in 10 s). For idempotent services
    (parameters). `client`: the peer's client of that service to use; by default a new
    one (which stays in the peer until it closes, and in what the server's participant
    has discovered)."""
    client = client or peer.node.create_client(srv_type, name)
    peer.spin_until(lambda: client.service_is_ready(), timeout, f"service {name}")
    for attempt in range(1, attempts + 1):
        future = client.call_async(request)
        try:
            peer.spin_until(future.done, timeout, f"reply from {name} (attempt {attempt} of {attempts})")
            return future.result()
        except AssertionError:
            client.remove_pending_request(future)
            if attempt == attempts:
                raise


def param(name: str, value) -> Parameter:
    """An rcl_interfaces/Parameter typed from the Python value: str, float, int, bool,
    a list (double array) or None (not set: what `ros2 param delete` sends)."""
    v = ParameterValue()
    if value is None:
        v.type = ParameterType.PARAMETER_NOT_SET
    elif isinstance(value, str):
        v.type, v.string_value = ParameterType.PARAMETER_STRING, value
    elif isinstance(value, bool):
        v.type, v.bool_value = ParameterType.PARAMETER_BOOL, value
    elif isinstance(value, float):
        v.type, v.double_value = ParameterType.PARAMETER_DOUBLE, value
    elif isinstance(value, int):
        v.type, v.integer_value = ParameterType.PARAMETER_INTEGER, value
    elif isinstance(value, list):
        v.type, v.double_array_value = ParameterType.PARAMETER_DOUBLE_ARRAY, [float(x) for x in value]
    return Parameter(name=name, value=v)
