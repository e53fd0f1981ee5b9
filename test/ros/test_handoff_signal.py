"""The hand-off's protocol version 2 (docs/HANDOFF.md, *The socket protocol*) through real
DDS and the node's Unix socket, with the Python consumer (python/vision_preproc_consumer):

- a consumer on the node's machine takes its tensors from the pool's socket (the ready
  signal) by itself and says so (`path`), another with `fast_path=False` from the topic:
  the arrays of the same stamps are equal byte for byte; the reports of the socket one
  reach /diagnostics (and `consumer_timing`) with camera stamp -> acquired within
  CONSUMER_REPORT_REL of what it measured itself, and acquired -> released at least what
  it held each frame; the node's greenwave statuses have the camera's rate;
- a consumer that upgrades and never reads its socket: the node goes on at the camera's
  rate, its descriptors stay what they were, the descriptors it cannot take are dropped
  and counted (/diagnostics), and when it reads at last a DROPPED notice tells it how many;
- a process of another user cannot connect to the socket (0600 in a 0700 directory).

Killed consumers, slow and greedy ones, 200 clients connecting and dying (half of them
upgraded) are test_handoff.py's cases, whose consumers are on the socket path too.
One node (namespace /handoff_signal, backend cpu, 161x120 float32); each case starts its
own camera (bench/rclpy_publisher.py, 320x240 photographs at 30 Hz).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vptools.rosharness import RELIABLE, Camera, NodeProcess, stamp_ns
from vptools.tolerances import CONSUMER_REPORT_REL

import rclpy  # noqa: E402 (after rosharness: the test run's domain)
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.node import Node  # noqa: E402
from vision_preproc_consumer import Frame, TensorRefSubscription  # noqa: E402
from vision_preproc_consumer.pool import ACCEPT, DESCRIPTOR, DROPPED, UPGRADE, cut_frames, frame  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming  # noqa: E402

NS = "/handoff_signal"
NODE_STATUS = "handoff_signal/vision_preproc"
RATE = 30.0
#: How long the socket consumer holds each frame (its acquired -> released).
HOLD_S = 0.004
#: A Python that user `nobody` may run (this one may live in root's home).
SYSTEM_PYTHON = "/usr/bin/python3"


def camera(count: int) -> Camera:
    return Camera(NS, "--width", "320", "--height", "240", "--rate", str(RATE), "--count", str(count),
                  "--seconds", "60", profile=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> NodeProcess:
    log = tmp_path_factory.mktemp("handoff_signal") / "node.log"
    args = ["-r", f"__ns:={NS}", "-p", "backend:=cpu", "-p", "network_image_width:=161",
            "-p", "network_image_height:=120"]
    with NodeProcess(args, log=log) as n:
        yield n
        assert n.stop() == 0, n.output()[-3000:]


class Peer:
    """This process's rclpy node: two TensorRefSubscriptions (the socket path and, with
    `fast_path=False`, the topic), /diagnostics, consumer_timing and FrameTiming."""

    def __init__(self) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node(f"signal_peer_{os.getpid()}", namespace=NS, context=self.context)
        self.arrays: dict[str, dict[int, bytes]] = {"socket": {}, "topic": {}}
        self.own: list[int] = []  # socket path: camera stamp -> usable (callback), ns
        self.statuses: list[tuple[float, Any]] = []
        self.timing_topic: list[Any] = []
        self.timings: list[tuple[float, FrameTiming]] = []
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, RELIABLE)
        self.node.create_subscription(DiagnosticArray, "consumer_timing", self.timing_topic.append, RELIABLE)
        self.node.create_subscription(FrameTiming, "timing", lambda m: self.timings.append((time.monotonic(), m)),
                                      RELIABLE)
        self.fast = TensorRefSubscription(self.node, "tensor_ref", self._on_socket, 10)
        self.slow = TensorRefSubscription(self.node, "tensor_ref", self._on_topic, 10, fast_path=False)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def _on_socket(self, f: Frame) -> None:
        usable = time.time_ns() - stamp_ns(f.msg.header)
        self.arrays["socket"][stamp_ns(f.msg.header)] = f.array().tobytes()
        t = time.monotonic()
        while time.monotonic() - t < HOLD_S:  # (its "network")
            pass
        f.release()
        self.own.append(usable)

    def _on_topic(self, f: Frame) -> None:
        with f:
            self.arrays["topic"][stamp_ns(f.msg.header)] = f.array().tobytes()

    def _on_diag(self, m: DiagnosticArray) -> None:
        self.statuses += [(time.monotonic(), s) for s in m.status]

    def spin_until(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            self.executor.spin_once(timeout_sec=0.01)

    def status(self, name: str, cond, timeout: float, what: str, after: float = 0.0) -> dict[str, str]:
        found: list = []

        def have() -> bool:
            found[:] = [kv for t, s in self.statuses if t > after and s.name == name
                        for kv in [{v.key: v.value for v in s.values}] if cond(kv)]
            return bool(found)

        self.spin_until(have, timeout, what)
        return found[-1]

    def close(self) -> None:
        self.fast.close()
        self.slow.close()
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def test_the_socket_path_is_taken_said_equal_and_measured(node: NodeProcess) -> None:
    """90 frames at 30 Hz: the fast consumer on the socket, the other on the topic, the same
    bytes; the node's report of the fast one equals what it measured itself (5 %)."""
    p = Peer()
    cam = camera(90)
    try:
        p.spin_until(lambda: cam.proc.poll() is not None and len(p.arrays["topic"]) >= 60
                     and len(p.own) >= 60, 30, "the camera's frames through both paths")
        pool = next(iter(p.fast.path))
        assert p.fast.path == {pool: "socket"} and p.slow.path == {pool: "topic"}, (p.fast.path, p.slow.path)
        assert p.fast.via_socket >= 55 and p.fast.via_topic <= 3, vars(p.fast)
        assert p.slow.via_socket == 0 and p.fast.dropped == 0 and p.fast.errors == 0, (vars(p.slow), vars(p.fast))
        both = set(p.arrays["socket"]) & set(p.arrays["topic"])
        assert len(both) >= 55, len(both)
        for s in both:
            assert p.arrays["socket"][s] == p.arrays["topic"][s], f"stamp {s}: the two paths' tensors differ"
        # Every frame handled is reported (the reports go out 100 ms after the last one).
        handled = p.fast.delivered + p.fast.skipped + p.fast.withdrawn
        name = f"{NODE_STATUS}: consumer {p.node.get_name()} (pid {os.getpid()})"
        kv = p.status(name, lambda kv: int(kv["Frames reported (window)"]) == handled, 10,
                      f"{handled} frames reported in /diagnostics")
        own_p50 = np.percentile(p.own, 50, method="inverted_cdf") / 1e6
        node_p50 = float(kv["Camera stamp -> acquired p50 (ms)"])
        assert abs(node_p50 - own_p50) <= CONSUMER_REPORT_REL * own_p50, (node_p50, own_p50, kv)
        assert float(kv["Camera stamp -> acquired p99 (ms)"]) >= node_p50
        assert float(kv["Acquired -> released p50 (ms)"]) >= HOLD_S * 1e3, kv
        assert float(kv["Descriptor delivery p50 (ms)"]) > 0 and kv["Descriptors dropped"] == "0", kv
        assert any(s.name == name for m in p.timing_topic for s in m.status), "consumer_timing"
        main = p.status(NODE_STATUS, lambda kv: True, 5, "the node's status")
        assert main["Shared consumers on the ready signal"] == "1" and main["Shared consumers"] == "2", main
        gw = p.status(f"{NS}/tensor_ref", lambda kv: "frame_rate_node" in kv, 5, "greenwave status of tensor_ref")
        for key in ("frame_rate_node", "frame_rate_msg"):
            assert abs(float(gw[key]) - RATE) < 0.2 * RATE, gw
        assert 0 < float(gw["current_delay_from_realtime_ms"]) < 1000 and gw["expected_frequency"] == "nan", gw
        print(f"socket path: {p.fast.via_socket} frames; camera -> usable p50 {own_p50:.2f} ms (node's report "
              f"{node_p50:.2f} ms); descriptor delivery p50 {kv['Descriptor delivery p50 (ms)']} ms; greenwave {gw}")
    finally:
        cam.stop()
        p.close()


def upgraded_client(path: str) -> socket.socket:
    """A socket-level client of version 2: the hello (its fds closed), UPGRADE, ACCEPT."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    buf, fds = b"", []
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("<I", buf[:4])[0]:
        data, got, _, _ = socket.recv_fds(s, 1 << 16, 256)
        buf, fds = buf + data, fds + got
    for fd in fds:
        os.close(fd)
    assert 2 in json.loads(buf[4:])["versions"]
    s.sendall(frame(UPGRADE, json.dumps({"version": 2, "name": "stuck"}).encode()))
    inbox = bytearray()
    while not (got := cut_frames(inbox)):
        inbox += s.recv(1 << 16)
    assert got[0][0] == ACCEPT and json.loads(got[0][1])["from_generation"] > 0, got
    return s


def test_a_consumer_that_never_reads_its_socket_costs_the_node_nothing(node: NodeProcess) -> None:
    """An upgraded client that never reads: the node publishes at the camera's rate, its
    descriptors stay as they were, drops are counted; then it reads: a DROPPED notice."""
    p = Peer()
    cam = camera(150)
    stuck = None
    try:
        p.spin_until(lambda: len(p.own) >= 5, 20, "frames")
        path = p.fast.clients[next(iter(p.fast.clients))].socket_path
        fds = len(os.listdir(f"/proc/{node.proc.pid}/fd"))
        stuck = upgraded_client(path)
        t0 = time.monotonic()
        kv = p.status(NODE_STATUS, lambda kv: int(kv["Shared dropped descriptors"]) >= 30, 15,
                      "30 descriptors dropped for the stuck consumer", after=t0)
        t1 = time.monotonic()
        rate = sum(1 for t, m in p.timings if t0 <= t <= t1 and m.outputs & FrameTiming.OUTPUT_TENSOR_REF) / (t1 - t0)
        assert rate >= 0.8 * RATE, f"tensor_ref {rate:.1f}/s while a consumer does not read its socket"
        assert len(os.listdir(f"/proc/{node.proc.pid}/fd")) <= fds + 1, "the stuck client's socket alone"
        stuck_kv = p.status(f"{NODE_STATUS}: consumer stuck (pid {os.getpid()})",
                            lambda kv: int(kv["Descriptors dropped"]) > 0, 5, "its own status")
        assert p.fast.dropped == 0, "the other consumer lost nothing"
        # It reads now: descriptors, and a DROPPED notice ahead of the next one that fits.
        stuck.settimeout(0.5)
        inbox, frames = bytearray(), []
        deadline = time.monotonic() + 5
        while not any(k == DROPPED for k, _ in frames) and time.monotonic() < deadline:
            p.executor.spin_once(timeout_sec=0.01)
            try:
                inbox += stuck.recv(1 << 16)
            except TimeoutError:
                continue
            frames += cut_frames(inbox)
        notice = next(b for k, b in frames if k == DROPPED)
        dropped, total = struct.unpack("<QQ", notice)
        assert dropped > 0 and total >= int(stuck_kv["Descriptors dropped"]) and total >= dropped, (dropped, total)
        assert sum(1 for k, _ in frames if k == DESCRIPTOR) > 0
        print(f"stuck consumer: node at {rate:.1f} tensor_ref/s, {kv['Shared dropped descriptors']} descriptors "
              f"dropped, told {dropped} (total {total})")
    finally:
        if stuck is not None:
            stuck.close()
        cam.stop()
        p.close()


def test_another_users_process_cannot_connect(node: NodeProcess) -> None:
    """The socket is the node's user's: a process of user `nobody` is refused by the
    kernel (the directory is 0700)."""
    if os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs root (to run a process as another user) and {SYSTEM_PYTHON}")
    p = Peer()
    cam = camera(30)
    try:
        p.spin_until(lambda: len(p.own) >= 2, 20, "frames")
        path = p.fast.clients[next(iter(p.fast.clients))].socket_path
    finally:
        cam.stop()
        p.close()
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"
    r = subprocess.run([SYSTEM_PYTHON, "-c", code], user=65534, capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "PermissionError" in r.stderr, r.stderr
    assert Path(path).exists()
