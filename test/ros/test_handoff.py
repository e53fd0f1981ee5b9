"""The zero-copy hand-off (docs/HANDOFF.md) through real DDS and the node's Unix socket,
with the Python consumer (python/vision_preproc_consumer) as the consumer, which takes its
tensors from the pool's socket (protocol 2, the ready signal) as it does by itself on the
node's machine (test_handoff_signal.py compares that path with the topic's):

- every TensorRef's array is its Tensor's data byte for byte (real photographs of several
  encodings; the descriptor's fields; the view is in place and read-only), and with two
  cameras its TensorBatch's; FrameTiming.outputs says both were published;
- a consumer holding a block past shared_lease_ms is disconnected and reconnects;
- a consumer process SIGKILLed while it holds every block: the blocks come back within
  RESUME_S, its socket is closed, no descriptor stays open in the node; 200 socket-level
  clients killed or closed while holding blocks: the node's descriptors back to where
  they were, the blocks back each time;
- a slow consumer (500 ms a frame) does not slow the node, and what it holds does not
  change under it; a greedy one (every frame it can take, 500 ms each) makes the node drop
  sets with the reason `no free shared block` (counted), never wait;
- bad clients (bytes sent, connect-and-hang, 500 connections at once) leave the node
  publishing at rate with a bounded number of descriptors, all back after they close;
- with no subscriber of `tensor` the tensor is not serialized (FrameTiming.outputs), and
  each output is produced only while it has subscribers;
- a larger output moves the consumers to a new pool.

One node (namespace /handoff, backend cpu, 161x120 float32: 231,840-byte tensors, not a
whole number of pages; 4 shared blocks) serves the cases in file order; the two-camera and
lease cases start their own. Its input from the cases that need a stream: a camera
process at 30 Hz (bench/rclpy_publisher.py, 320x240 photographs). The consumer processes
are test/ros/handoff_peer.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from vptools import oracle
from vptools.rosharness import BEST_EFFORT, RELIABLE, Camera, NodeProcess, call, frame_msg, param, stamp_ns
from vptools.sources import photo_frame
from vptools.tolerances import assert_close

import rclpy  # noqa: E402 (after rosharness: the test run's domain)
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from vision_preproc_consumer import Frame, TensorRefSubscription  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming, Tensor, TensorBatch, TensorRef  # noqa: E402

from handoff_peer import HOLD_S, plain_client  # noqa: E402 (test/ros/handoff_peer.py)

NS = "/handoff"
NET_W, NET_H = 161, 120
CONFIG = {"network_image_width": NET_W, "network_image_height": NET_H}
BLOCKS = 4  # shared_pool_size's default
PEER = Path(__file__).with_name("handoff_peer.py")
#: The node's /diagnostics keys of the pool.
KEY_IN_USE = "Shared blocks in use"
KEY_CONSUMERS = "Shared consumers"
KEY_NO_FREE = "Frames dropped (no free shared block)"
#: Blocks given back by a consumer's end are published again within this time.
RESUME_S = 1.0
#: The slow and the greedy consumer run this long. The slow one's soak (10 minutes) is this
#: test with VP_SLOW_CONSUMER_S=600 (docs/TESTING.md).
SLOW_S = float(os.environ.get("VP_SLOW_CONSUMER_S", "20"))
GREEDY_S = 3.0
#: The node's consumers at once (src/handoff: MAX_CONSUMERS); more are refused.
MAX_CONSUMERS = 64
DEEP = QoSProfile(reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST, depth=200)
PAGE = mmap.PAGESIZE
_names = itertools.count()


class Consumer:
    """An rclpy node of this process: a TensorRefSubscription on `<ns>/tensor_ref` whose
    callback copies each frame's bytes (by stamp; the first `keep` frames are kept, the
    others given back at once), FrameTiming, the node's /diagnostics, optionally `tensor`
    (typed `tensor_type`) and image publishers (`images`: (topic, QoS))."""

    def __init__(self, ns: str, tensor_type: Any = None, refs: bool = True,
                 images: tuple[tuple[str, QoSProfile], ...] = (), keep: int = 0) -> None:
        self.ns = ns
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node(f"handoff_consumer_{os.getpid()}_{next(_names)}", namespace=ns, context=self.context)
        self.pubs = [self.node.create_publisher(Image, topic, qos) for topic, qos in images]
        self.refs: dict[int, tuple[Any, bytes]] = {}  # stamp -> (TensorRef, the array's bytes)
        self.delivered: list[tuple[float, int]] = []  # (when, generation)
        self.not_in_place: list[str] = []
        self.keep, self.kept = keep, []
        self.tensors: dict[int, Any] = {}
        self.timings: list[tuple[float, FrameTiming]] = []
        self.statuses: list[tuple[float, Any]] = []
        self.status_name = f"{ns.strip('/')}/vision_preproc"
        if tensor_type is not None:
            self.node.create_subscription(tensor_type, "tensor",
                                          lambda m: self.tensors.__setitem__(stamp_ns(m.header), m), DEEP)
        self.node.create_subscription(FrameTiming, "timing", lambda m: self.timings.append((time.monotonic(), m)),
                                      DEEP)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, RELIABLE)
        self.sub = TensorRefSubscription(self.node, "tensor_ref", self._on_frame, 10) if refs else None
        self.executor = rclpy.executors.SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def _on_frame(self, frame: Frame) -> None:
        a = frame.array()
        m = frame.msg
        # In place: the array starts at byte_offset of the block this process mapped.
        block = self.sub.clients[m.pool_id].block(m.block_index)
        if a.flags.writeable or a.ctypes.data != block.address + m.byte_offset:
            self.not_in_place.append(f"block {m.block_index}: writeable {a.flags.writeable}, at "
                                     f"{a.ctypes.data - block.address} (byte_offset {m.byte_offset})")
        self.refs[stamp_ns(m.header)] = (m, a.tobytes())
        self.delivered.append((time.monotonic(), m.generation))
        if len(self.kept) < self.keep:
            self.kept.append(frame)
        else:
            frame.release()

    def _on_diagnostics(self, m: DiagnosticArray) -> None:
        self.statuses += [(time.monotonic(), s) for s in m.status if s.name == self.status_name]

    def spin_until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            self.executor.spin_once(timeout_sec=0.01)

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.01)

    def publish_until(self, pub: int, msg: Image, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """Publish `msg` on `pubs[pub]` (again each second: best effort, the node may still
        be matching) until `cond()`."""
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            self.pubs[pub].publish(msg)
            end = min(deadline, time.monotonic() + 1.0)
            while time.monotonic() < end and not cond():
                self.executor.spin_once(timeout_sec=0.01)

    def status(self, cond: Callable[[dict], bool], timeout: float, what: str, after: float) -> Any:
        """The first /diagnostics status received after `after` whose key -> value dict
        satisfies `cond`."""
        found: list = []

        def have() -> bool:
            found[:] = [s for t, s in self.statuses if t > after and cond({v.key: v.value for v in s.values})]
            return bool(found)

        try:
            self.spin_until(have, timeout, what)
        except AssertionError:
            last = {v.key: v.value for v in self.statuses[-1][1].values} if self.statuses else None
            raise AssertionError(f"{what}: not within {timeout} s; last status {last}") from None
        return found[0]

    def resumed_after(self, t: float, timeout: float, what: str) -> float:
        """Seconds from `t` to the first frame delivered after it from a block published
        after it (a generation newer than every one delivered before `t`)."""
        newest = max((g for when, g in self.delivered if when <= t), default=0)
        self.spin_until(lambda: any(when > t and g > newest for when, g in self.delivered), timeout + 2, what)
        return min(when for when, g in self.delivered if when > t and g > newest) - t

    def ref_rate(self, start: float, end: float) -> float:
        """Sets published with a TensorRef per second (FrameTiming.outputs) between two
        receive times."""
        n = sum(1 for t, m in self.timings if start <= t <= end and m.outputs & FrameTiming.OUTPUT_TENSOR_REF)
        return n / (end - start)

    def close(self) -> None:
        for f in self.kept:
            f.release()
        if self.sub is not None:
            self.sub.close()
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


class PeerProcess:
    """test/ros/handoff_peer.py in its own process; its output lines collected."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PEER), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, prefix: str, consumer: Consumer, timeout: float) -> None:
        consumer.spin_until(lambda: any(l.startswith(prefix) for l in self.lines) or self.proc.poll() is not None,
                            timeout, f"{prefix!r} from handoff_peer.py {self.proc.args[2:]}")
        assert any(l.startswith(prefix) for l in self.lines), "\n".join(self.lines[-30:])

    def summary(self, consumer: Consumer, timeout: float) -> dict:
        """The JSON line it prints when it ends (spinning `consumer` meanwhile)."""
        consumer.spin_until(lambda: self.proc.poll() is not None, timeout, "handoff_peer.py to end")
        time.sleep(0.1)
        assert self.proc.returncode == 0, "\n".join(self.lines[-30:])
        return json.loads(next(l for l in reversed(self.lines) if l.startswith("{")))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=5)


def node_fds(pid: int, socket_path: str) -> dict[str, int]:
    """The node's open descriptors: all of them, its hand-off sockets (the listener and
    one per connected consumer: the Unix sockets bound to the pool's socket path, from
    /proc/<pid>/net/unix) and its memfds."""
    paths = {}
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        if len(f) >= 8:
            paths[f[6]] = f[7]
    out = {"total": 0, "handoff": 0, "memfd": 0}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        out["total"] += 1
        if target.startswith("socket:[") and paths.get(target[8:-1]) == socket_path:
            out["handoff"] += 1
        elif target.startswith("/memfd:"):
            out["memfd"] += 1
    return out


def wait_fds(pid: int, path: str, cond: Callable[[dict], bool], timeout: float, what: str) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        fds = node_fds(pid, path)
        if cond(fds):
            return fds
        assert time.monotonic() < deadline, f"{what}: node descriptors {fds} after {timeout} s"
        time.sleep(0.05)


def value(status: Any, key: str) -> int:
    kv = {v.key: v.value for v in status.values}
    assert key in kv, f"no /diagnostics key {key!r}: {sorted(kv)}"
    return int(kv[key])


def check_descriptor(ref: Any, shape: list[int], nbytes: int) -> None:
    """The TensorRef fields a float32 host-memory tensor of `shape` has (docs/HANDOFF.md,
    TensorRef.msg)."""
    assert (ref.dtype, list(ref.shape)) == ("float32", shape), ref
    assert list(ref.strides) == [int(np.prod(shape[i + 1:])) for i in range(len(shape))], "dense C order"
    assert (ref.dtype_code, ref.dtype_bits, ref.dtype_lanes) == (2, 32, 1)
    assert ref.byte_size == nbytes and ref.byte_offset + ref.byte_size <= ref.block_size
    assert ref.block_size == -(-nbytes // PAGE) * PAGE, f"block_size {ref.block_size}: {nbytes} bytes to the page"
    assert ref.memory_kind == TensorRef.MEMORY_HOST and ref.device_id == -1 and not any(ref.device_uuid)
    assert len(ref.ipc_event_handle) == 0
    assert 0 <= ref.block_index < BLOCKS and ref.generation > 0
    assert re.fullmatch(r"[0-9a-f]{16}", ref.pool_id), ref.pool_id
    # The socket: <dir>/<pool_id>.sock, 0600 in a 0700 directory, ours.
    path = Path(ref.socket_path)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    want_dir = Path(xdg) / "vision_preproc" if xdg and Path(xdg).is_dir() else Path(f"/tmp/vision_preproc-{os.geteuid()}")
    assert path == want_dir / f"{ref.pool_id}.sock", path
    st, dst = path.stat(), path.parent.stat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid(), oct(st.st_mode)
    assert stat.S_IMODE(dst.st_mode) == 0o700 and dst.st_uid == os.geteuid(), oct(dst.st_mode)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> NodeProcess:
    """The cases' node; shared_lease_ms 5000: holders in these cases are killed sooner."""
    log = tmp_path_factory.mktemp("handoff") / "node.log"
    args = ["-r", f"__ns:={NS}", "-p", "backend:=cpu", "-p", f"network_image_width:={NET_W}",
            "-p", f"network_image_height:={NET_H}", "-p", "shared_lease_ms:=5000"]
    with NodeProcess(args, log=log) as n:
        yield n
        assert n.stop() == 0, n.output()[-3000:]


@pytest.fixture(scope="module")
def camera(node: NodeProcess) -> Camera:
    """320x240 photographs at 30 Hz into the node, for the rest of the module."""
    cam = Camera(NS, "--width", "320", "--height", "240", "--rate", "30", "--seconds", "900", profile=True)
    yield cam
    cam.stop()


FRAMES = [("bgr8", "chelsea.png", None), ("rgb8", "astronaut.png", (256, 256)), ("yuyv", "coffee.png", (300, 200)),
          ("nv12", "rocket.jpg", (214, 320)), ("mono8", "camera.png", None), ("bayer_rggb8", "chelsea.png", None)]


def shared_block_rss_kb(pid: int) -> int:
    """Resident kB of process `pid`'s mappings of the tensor_ref pool's memfds."""
    total, name = 0, ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) >= 6 else ""
        elif line.startswith("Rss:") and name.startswith("/memfd:vision_preproc"):
            total += int(head[1])
    return total


def test_the_blocks_stay_untouched_while_nobody_subscribes_to_tensor_ref(tmp_path: Path) -> None:
    """The pool costs no memory until a consumer comes (issue 37, a new user's RSS
    question): with only a `tensor` subscriber, 120 frames leave the node's 4 shared blocks
    (3.7 MB each) unwritten, so not resident; with a tensor_ref consumer they are written,
    and the same measurement sees them (the witness)."""
    ns = "/handoff_untouched"
    with NodeProcess(["-r", f"__ns:={ns}", "-p", "backend:=cpu"], log=tmp_path / "node.log") as node:
        cam = Camera(ns, "--width", "640", "--height", "480", "--rate", "30", "--seconds", "30", profile=True)
        c = Consumer(ns, tensor_type=Tensor, refs=False)
        try:
            c.spin_until(lambda: len(c.tensors) >= 120, 30, "120 tensors without a tensor_ref consumer")
            idle = shared_block_rss_kb(node.proc.pid)
            c.sub = TensorRefSubscription(c.node, "tensor_ref", c._on_frame, 10)
            c.spin_until(lambda: c.sub.delivered >= 8, 30, "8 frames through tensor_ref")
            used = shared_block_rss_kb(node.proc.pid)
        finally:
            c.close()
            cam.stop()
        assert node.stop() == 0
    block_kb = 640 * 480 * 3 * 4 // 1024
    # At most the pool's control page(s) while nobody subscribes; a block once written.
    assert idle <= 16, f"{idle} kB of shared blocks resident without a tensor_ref subscriber"
    assert used >= block_kb, f"{used} kB resident after 8 frames through blocks of {block_kb} kB"


def test_every_tensor_ref_array_is_its_tensor_byte_for_byte(node: NodeProcess) -> None:
    """Six photographs (more frames than blocks: blocks are reused), one at a time: the
    Tensor and the TensorRef of each; the array equals the Tensor's data byte for byte
    and the oracle within FLOAT32_ABS; the descriptor's fields; the view is the mapped
    block itself, read-only; generations increase; FrameTiming.outputs has both bits."""
    c = Consumer(NS, Tensor, images=(("image", BEST_EFFORT),))
    try:
        c.spin_until(lambda: c.pubs[0].get_subscription_count() >= 1, 20, "the node on DDS")
        # A first frame until both outputs come: the node has matched both subscriptions.
        warm = frame_msg(photo_frame("bgr8", "chelsea.png"), 1_800_000_000_000_000_000, "cam")
        c.publish_until(0, warm, lambda: {stamp_ns(warm.header)} <= set(c.refs) & set(c.tensors), 30,
                        "a Tensor and a TensorRef")
        sent = {}
        for k, (encoding, photo, size) in enumerate(FRAMES, 1):
            frame = photo_frame(encoding, photo, size=size)
            stamp = 1_800_000_000_000_000_000 + k * 1_000_003
            sent[stamp] = frame
            c.publish_until(0, frame_msg(frame, stamp, "cam"), lambda: stamp in c.refs and stamp in c.tensors, 15,
                            f"the Tensor and the TensorRef of {encoding} {photo}")
        assert not c.not_in_place, c.not_in_place
        generations = []
        for stamp, frame in sent.items():
            ref, data = c.refs[stamp]
            t = c.tensors[stamp]
            what = f"{frame.encoding} {frame.width}x{frame.height}"
            tensor_bytes = bytes(t.data)
            if data != tensor_bytes:
                i = next(i for i in range(min(len(data), len(tensor_bytes))) if data[i] != tensor_bytes[i])
                raise AssertionError(f"{what}: TensorRef array differs from the Tensor's data at byte {i} of "
                                     f"{len(tensor_bytes)} (lengths {len(data)}, {len(tensor_bytes)})")
            assert ref.header == t.header and (ref.name, ref.layout) == (t.name, t.layout), what
            check_descriptor(ref, [1, 3, NET_H, NET_W], len(tensor_bytes))
            [item] = ref.items
            assert item.topic == f"{NS}/image" and item.valid and not item.repeated and item.header == t.header
            assert (item.source_encoding, item.source_width, item.source_height) == (
                t.source_encoding, t.source_width, t.source_height) == (frame.encoding, frame.width, frame.height)
            assert (item.scale_x, item.scale_y, item.offset_x, item.offset_y) == (
                t.scale_x, t.scale_y, t.offset_x, t.offset_y), what
            want = oracle.preprocess(frame.data, frame.encoding, frame.width, frame.height, frame.step,
                                     frame.big_endian, CONFIG)
            assert_close(np.frombuffer(data, "<f4").reshape(ref.shape), want, "float32", f"TensorRef of {what}")
            generations.append(ref.generation)
        assert generations == sorted(set(generations)), generations
        assert len({c.refs[s][0].block_index for s in sent}) == BLOCKS, "six frames went through all four blocks"
        c.spin_until(lambda: {stamp_ns(m.header) for _, m in c.timings} >= set(sent), 5, "the FrameTimings")
        for _, m in c.timings:
            if stamp_ns(m.header) in sent:
                assert m.outputs == FrameTiming.OUTPUT_TENSOR | FrameTiming.OUTPUT_TENSOR_REF, m.outputs
        s = c.sub
        # (Host blocks carry no event: nothing is ever withdrawn.)
        assert (s.skipped, s.withdrawn, s.errors, s.reconnects, len(s.clients)) == (0, 0, 0, 0, 1), vars(s)
    finally:
        c.close()


def test_two_cameras_tensor_batch_and_tensor_ref_agree(tmp_path: Path) -> None:
    """`inputs: [cam0/image, cam1/image]`: every TensorBatch has a TensorRef with the
    same header, items and bytes; valid items equal the oracle."""
    ns, w, h = "/handoff_batch", 45, 31
    config = {"network_image_width": w, "network_image_height": h}
    a = photo_frame("bgr8", "astronaut.png", size=(96, 64))
    b = photo_frame("yuyv", "coffee.png", size=(80, 60))
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", f"network_image_width:={w}",
            "-p", f"network_image_height:={h}", "-p", "inputs:=[cam0/image, cam1/image]"]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        c = Consumer(ns, TensorBatch, images=(("cam0/image", RELIABLE), ("cam1/image", RELIABLE)))
        try:
            c.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in c.pubs), 20, "the node on DDS")
            sent = {}

            def fresh() -> list[int]:
                return [s for s, m in c.tensors.items() if s in c.refs
                        and all(it.valid and not it.repeated for it in m.items)]

            for k in range(60):
                s0 = 1_900_000_000_000_000_000 + k * 100_000_000
                sent[s0], sent[s0 + 1000] = a, b
                c.pubs[0].publish(frame_msg(a, s0, "cam0"))
                c.pubs[1].publish(frame_msg(b, s0 + 1000, "cam1"))
                c.spin_for(0.1)
                if len(fresh()) >= 4:
                    break
            assert len(fresh()) >= 4, f"{len(c.tensors)} batches, {len(c.refs)} TensorRefs"
            # From the first batch with a TensorRef (the node had matched this consumer), all.
            first = min(s for s in c.tensors if s in c.refs)
            batches = {s: m for s, m in c.tensors.items() if s >= first}
            c.spin_until(lambda: set(batches) <= set(c.refs), 5, "a TensorRef for every TensorBatch")
            assert not c.not_in_place, c.not_in_place
            for stamp, batch in batches.items():
                ref, data = c.refs[stamp]
                assert data == bytes(batch.data), f"batch {stamp}: TensorRef bytes differ from the TensorBatch's"
                assert ref.header == batch.header and list(ref.items) == list(batch.items)
                assert [it.topic for it in ref.items] == [f"{ns}/cam0/image", f"{ns}/cam1/image"]
                check_descriptor(ref, [2, 3, h, w], len(batch.data))
                values = np.frombuffer(data, "<f4").reshape(ref.shape)
                for i, it in enumerate(ref.items):
                    if it.valid:
                        f = sent[stamp_ns(it.header)]
                        want = oracle.preprocess(f.data, f.encoding, f.width, f.height, f.step, f.big_endian, config)
                        assert_close(values[i], want[0], "float32", f"batch {stamp} item {i}")
            assert (c.sub.skipped, c.sub.withdrawn, c.sub.errors, c.sub.reconnects) == (0, 0, 0, 0), vars(c.sub)
        finally:
            c.close()
        assert node.stop() == 0


def test_a_consumer_holding_past_the_lease_is_disconnected_and_reconnects(tmp_path: Path) -> None:
    """shared_lease_ms 300, 2 blocks: the consumer keeps its first frame; the node takes
    the block back when it needs it (the consumer's connection closes, WARN naming
    tensor_ref), the subscription connects again on the next message and frames flow;
    giving the kept frame back afterwards writes nothing."""
    ns = "/handoff_lease"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "network_image_width:=64",
            "-p", "network_image_height:=48", "-p", "shared_pool_size:=2", "-p", "shared_lease_ms:=300"]
    frame = photo_frame("bgr8", "chelsea.png", size=(160, 120))
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        c = Consumer(ns, images=(("image", BEST_EFFORT),), keep=1)
        try:
            c.spin_until(lambda: c.pubs[0].get_subscription_count() >= 1, 20, "the node on DDS")
            k = 0

            def send_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
                nonlocal k
                deadline = time.monotonic() + timeout
                while not cond():
                    assert time.monotonic() < deadline, f"timed out waiting for {what}: {vars(c.sub)}"
                    c.pubs[0].publish(frame_msg(frame, 2_000_000_000_000_000_000 + k, "cam"))
                    k += 1
                    c.spin_for(0.05)

            send_until(lambda: len(c.kept) == 1, 20, "a frame to keep")
            kept = c.kept[0]
            old = c.sub.clients[kept.msg.pool_id]
            t_kept = time.monotonic()
            send_until(lambda: c.sub.reconnects >= 1, 10, "the node to disconnect the consumer")
            # (t_kept: when the frame arrived, a little after it was published)
            assert time.monotonic() - t_kept >= 0.25, "disconnected before shared_lease_ms"
            assert not old.connected
            n = c.sub.delivered
            send_until(lambda: c.sub.delivered >= n + 3, 10, "frames through the new connection")
            new = c.sub.clients[kept.msg.pool_id]
            assert new is not old and new.connected and c.sub.reconnects == 1, vars(c.sub)
            kept.release()  # the node took it back already: nothing is written
            c.kept.clear()
            assert old.held(kept.msg.block_index) == 0
            c.status(lambda kv: kv.get(KEY_CONSUMERS) == "1", 5, "one consumer after the reconnection",
                     after=time.monotonic())
        finally:
            c.close()
        assert node.stop() == 0
    assert re.search(r"^\[WARN\].*tensor_ref.*shared_lease_ms", node.output(), re.M), node.output()[-3000:]


def lone_consumer(cleanup: contextlib.ExitStack, frames: int) -> tuple[Consumer, str]:
    """This process's consumer (closed by `cleanup`) once `frames` tensor_refs reached it,
    the only consumer of the pool: (the consumer, the pool's socket path)."""
    c = Consumer(NS)
    cleanup.callback(c.close)
    c.spin_until(lambda: c.sub.delivered >= frames, 30, "tensor_ref frames from the camera")
    path = next(iter(c.refs.values()))[0].socket_path
    c.status(lambda kv: kv.get(KEY_CONSUMERS) == "1", 5, "this consumer alone", after=time.monotonic())
    return c, path


def test_a_killed_consumer_gives_its_blocks_back(node: NodeProcess, camera: Camera) -> None:
    """A consumer process that takes every frame and never gives one back holds all four
    blocks (the node publishes no tensor_ref then); SIGKILL: within RESUME_S a new
    tensor_ref reaches this process's consumer, /diagnostics shows the blocks and the
    consumer gone, and the node closed its socket (no other descriptor left open)."""
    with contextlib.ExitStack() as cleanup:
        c, path = lone_consumer(cleanup, 5)
        before = node_fds(node.proc.pid, path)
        assert before["handoff"] == 2 and before["memfd"] >= BLOCKS + 1, before  # the listener + this consumer
        holder = PeerProcess("hold", f"{NS}/tensor_ref")
        cleanup.callback(holder.kill)
        holder.wait_line(f"held {BLOCKS}", c, 30)
        c.status(lambda kv: kv.get(KEY_IN_USE) == str(BLOCKS) and kv.get(KEY_CONSUMERS) == "2", 5,
                 "every block held, two consumers", after=time.monotonic())
        holding = node_fds(node.proc.pid, path)
        assert holding["handoff"] == before["handoff"] + 1 and holding["memfd"] == before["memfd"], (before, holding)
        t_kill = time.monotonic()
        holder.kill()
        back = c.resumed_after(t_kill, RESUME_S, "a tensor_ref after the holder was killed")
        assert back < RESUME_S, f"blocks back {back:.2f} s after SIGKILL"
        c.status(lambda kv: kv.get(KEY_CONSUMERS) == "1" and int(kv.get(KEY_IN_USE, 99)) <= 1, 5,
                 "the killed consumer and its blocks gone", after=t_kill)
        after = wait_fds(node.proc.pid, path, lambda f: f["handoff"] == before["handoff"], 2,
                         "the killed consumer's socket closed")
        # (Fast DDS may keep descriptors for the killed participant until its lease ends:
        # the total is compared with the count while it lived, less its socket.)
        assert after["memfd"] == before["memfd"] and after["total"] <= holding["total"] - 1, (before, holding, after)
        print(f"blocks back {1e3 * back:.0f} ms after SIGKILL; node descriptors {before} -> {holding} -> {after}")


def test_200_socket_clients_killed_or_closed_mid_hold(node: NodeProcess, camera: Camera) -> None:
    """Five waves of 40 socket-level clients (handoff_peer.plain_client: the hello, a hold
    added in their row; half of them upgraded to the ready signal, protocol 2), 20 in a
    process that is SIGKILLed and 20 here that close, every block held by them: after each wave the blocks are back within RESUME_S; at the end
    the node's descriptors are exactly what they were and it is still publishing."""
    with contextlib.ExitStack() as cleanup:
        c, path = lone_consumer(cleanup, 3)
        base = node_fds(node.proc.pid, path)
        backs = []
        for wave in range(5):
            child = PeerProcess("plain", path, "20")
            cleanup.callback(child.kill)
            child.wait_line("holding 20", c, 15)
            mine = [plain_client(path, i, upgrade=i % 2 == 0) for i in range(20)]
            assert all(h["pool_id"] == mine[0][1]["pool_id"] and h["blocks"] == BLOCKS for _, h, _ in mine)
            during = node_fds(node.proc.pid, path)
            assert during["handoff"] == base["handoff"] + 40, (wave, base, during)
            t = time.monotonic()
            child.kill()
            for s, _, ctrl in mine:
                s.close()
                ctrl.close()
            backs.append(c.resumed_after(t, RESUME_S, f"a tensor_ref after wave {wave}"))
            assert backs[-1] < RESUME_S, f"wave {wave}: blocks back after {backs[-1]:.2f} s"
            wait_fds(node.proc.pid, path, lambda f: f["handoff"] == base["handoff"], 2, f"wave {wave} closed")
        after = wait_fds(node.proc.pid, path, lambda f: f == base, 3, "the node's descriptors as before")
        n = c.sub.delivered
        c.spin_until(lambda: c.sub.delivered >= n + 5, 5, "tensor_ref frames after the waves")
        c.status(lambda kv: kv.get(KEY_CONSUMERS) == "1", 5, "this consumer alone again", after=time.monotonic())
        assert (c.sub.reconnects, c.sub.errors) == (0, 0), vars(c.sub)
        print(f"200 clients: blocks back in {max(backs) * 1e3:.0f} ms at most; descriptors {base} -> {after}")


def peer_run(c: Consumer, kind: str, seconds: float) -> tuple[dict, float, float]:
    """A consumer process of `kind` on tensor_ref for `seconds`, while `c` spins: its
    summary, and when it ran (its first frame, its end)."""
    peer = PeerProcess(kind, f"{NS}/tensor_ref", str(seconds))
    peer.wait_line("first frame", c, 30)
    start = time.monotonic()
    summary = peer.summary(c, seconds + 30)
    return summary, start, time.monotonic()


def test_a_slow_consumer_does_not_slow_the_node(node: NodeProcess, camera: Camera) -> None:
    """A consumer process that holds each frame HOLD_S inside its callback: the node goes
    on publishing tensor_ref at the rate it had before (measured here, 1.5 s), within 20 %,
    FrameTiming.total_us stays far under HOLD_S, the bytes a frame had when taken are
    those it has when given back, and the frames whose blocks were reused while the slow
    consumer slept are skipped by generation. Then a greedy consumer (every frame it can
    take, HOLD_S each): sets are dropped with the reason `no free shared block`
    (/diagnostics), the node never waits, and is back at its rate within RESUME_S of the
    consumer's end."""
    c = Consumer(NS)
    try:
        c.spin_until(lambda: c.sub.delivered >= 5, 30, "tensor_ref frames from the camera")
        t0 = time.monotonic()
        c.spin_for(1.5)
        rate0 = c.ref_rate(t0, time.monotonic())
        assert rate0 > 10, f"{rate0:.1f} tensor_ref/s before the slow consumer"

        s, t1, t2 = peer_run(c, "slow", SLOW_S)
        rate = c.ref_rate(t1, t2)
        totals = [m.total_us / 1e3 for t, m in c.timings if t1 <= t <= t2]
        assert rate >= 0.8 * rate0, f"tensor_ref {rate:.1f}/s with the slow consumer, {rate0:.1f}/s before"
        assert np.percentile(totals, 99) < 0.5 * HOLD_S * 1e3, f"total_us p99 {np.percentile(totals, 99):.0f} ms"
        assert s["changed_while_held"] == 0, s
        assert s["held"] >= 0.5 * SLOW_S / HOLD_S and min(s["hold_s"]) >= HOLD_S, s
        assert s["skipped"] > 0 and (s["withdrawn"], s["errors"], s["reconnects"]) == (0, 0, 0), s
        print(f"slow consumer: {s['held']} frames held {HOLD_S} s, {s['skipped']} skipped by generation; "
              f"node tensor_ref {rate:.1f}/s (before {rate0:.1f}/s), total_us p99 {np.percentile(totals, 99):.1f} ms")

        t3 = time.monotonic()
        drops0 = value(c.status(lambda kv: True, 5, "a status", after=t3), KEY_NO_FREE)
        g, t4, t5 = peer_run(c, "greedy", GREEDY_S)
        starved = c.ref_rate(t4, t5)
        c.spin_for(0.1)
        back = c.resumed_after(t5, RESUME_S, "tensor_ref after the greedy consumer")
        t6 = time.monotonic()
        c.spin_for(1.0)
        rate_after = c.ref_rate(t6, time.monotonic())
        warned = [s for t, s in c.statuses if t3 < t and "no free shared block" in s.message]
        assert warned and warned[0].level == DiagnosticStatus.WARN, [s.message for _, s in c.statuses[-5:]]
        drops = value(c.statuses[-1][1], KEY_NO_FREE)
        assert drops > drops0, (drops0, drops)
        assert g["changed_while_held"] == 0 and g["held"] > 0, g
        assert 0 < starved < 0.75 * rate0, f"tensor_ref {starved:.1f}/s with every block held (before {rate0:.1f}/s)"
        assert back < RESUME_S and rate_after >= 0.8 * rate0, (back, rate_after, rate0)
        print(f"greedy consumer: held {g['held']} frames; node tensor_ref {starved:.1f}/s, {drops - drops0} sets "
              f"dropped (no free shared block), back in {1e3 * back:.0f} ms, then {rate_after:.1f}/s; "
              f"status: {warned[0].message!r}")
    finally:
        c.close()


def test_bad_clients_do_not_disturb_the_node(node: NodeProcess, camera: Camera) -> None:
    """10 clients that send bytes (each disconnected), 30 that connect and never read,
    500 connections at once: this process's consumer receives tensor_ref at its rate
    throughout (within 30 %), the node's hand-off sockets never exceed the listener and
    MAX_CONSUMERS, every connection gets a hello or a refusal, and after they close the
    node's descriptors are exactly what they were."""
    c = Consumer(NS)
    clients: list[socket.socket] = []
    try:
        c.spin_until(lambda: c.sub.delivered >= 5, 30, "tensor_ref frames from the camera")
        path = next(iter(c.refs.values()))[0].socket_path
        c.status(lambda kv: kv.get(KEY_CONSUMERS) == "1", 5, "this consumer alone", after=time.monotonic())
        base = node_fds(node.proc.pid, path)
        t0 = time.monotonic()
        c.spin_for(1.5)
        rate0 = c.ref_rate(t0, time.monotonic())

        def connect() -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(path)
            clients.append(s)
            return s

        t1 = time.monotonic()
        garbage = [connect() for _ in range(10)]
        for s in garbage:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        hang = [connect() for _ in range(30)]
        c.spin_for(0.2)
        storm = []
        for _ in range(500):
            storm.append(connect())
            if len(storm) % 50 == 0:
                c.spin_for(0.01)
        peak = node_fds(node.proc.pid, path)
        c.spin_for(1.0)
        # Each garbage client: its hello, then the end of the connection.
        for s in garbage:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert data[4:] and json.loads(data[4:])["magic"] == "vision_preproc/pool", data[:200]
        hellos = []
        for s in storm:
            head = s.recv(4, socket.MSG_WAITALL)
            hellos.append(json.loads(s.recv(struct.unpack("<I", head)[0], socket.MSG_WAITALL)))
        refused = [h for h in hellos if "error" in h]
        assert all(h["magic"] == "vision_preproc/pool" and h["version"] == 1 and h["error"] for h in refused)
        assert len(hellos) - len(refused) <= MAX_CONSUMERS and len(refused) >= 500 - MAX_CONSUMERS, len(refused)
        during = c.ref_rate(t1, time.monotonic())
        for s in clients:
            s.close()
        clients.clear()
        # The listener and at most MAX_CONSUMERS (+ a refused one being answered).
        assert peak["handoff"] <= 1 + MAX_CONSUMERS + 1, peak
        after = wait_fds(node.proc.pid, path, lambda f: f == base, 3, "the node's descriptors as before")
        c.status(lambda kv: kv.get(KEY_CONSUMERS) == "1", 5, "this consumer alone again", after=time.monotonic())
        assert during >= 0.7 * rate0, f"tensor_ref {during:.1f}/s during the bad clients, {rate0:.1f}/s before"
        assert (c.sub.reconnects, c.sub.errors) == (0, 0), vars(c.sub)
        print(f"bad clients: {len(refused)} of 500 refused; tensor_ref {during:.1f}/s (before {rate0:.1f}/s); "
              f"descriptors {base} -> peak {peak} -> {after}")
    finally:
        for s in clients:
            s.close()
        c.close()


def test_without_tensor_subscribers_the_tensor_is_not_serialized(node: NodeProcess, camera: Camera) -> None:
    """FrameTiming.outputs follows the subscribers: tensor_ref alone -> OUTPUT_TENSOR_REF
    (the tensor is not serialized), every descriptor reaching this consumer; with a
    `tensor` subscriber too -> both, every tensor arriving; without the tensor_ref
    consumer -> OUTPUT_TENSOR."""
    c = Consumer(NS)
    try:
        c.spin_until(lambda: c.node.count_subscribers(f"{NS}/tensor") == 0 and c.sub.delivered >= 3, 30,
                     "no subscriber of tensor, tensor_ref frames")

        def settle(want: int, what: str, timeout: float = 10) -> list[FrameTiming]:
            """The FrameTimings of 0.6 s once the last 10 all had `outputs` == want."""
            c.spin_until(lambda: len(c.timings) >= 10 and all(m.outputs == want for _, m in c.timings[-10:]),
                         timeout, f"outputs {want} ({what}); last {[m.outputs for _, m in c.timings[-10:]]}")
            t = time.monotonic()
            c.spin_for(0.6)
            got = [m for when, m in c.timings if when > t]
            assert len(got) >= 10 and all(m.outputs == want for m in got), (what, [m.outputs for m in got])
            return got

        skipped_before = c.sub.skipped
        only_ref = settle(FrameTiming.OUTPUT_TENSOR_REF, "tensor_ref only")
        c.spin_for(0.3)
        missing = [stamp_ns(m.header) for m in only_ref if stamp_ns(m.header) not in c.refs]
        # A descriptor not delivered must be one the subscription counted as skipped (its
        # block reused before this consumer, behind under load, could take it: a fresh-clone
        # run's third ROS pass saw 6 of 28 in a row), never lost silently; most arrive.
        skipped = c.sub.skipped - skipped_before
        assert len(missing) <= skipped and len(missing) <= len(only_ref) // 2, \
            f"{len(missing)} of {len(only_ref)} descriptors not delivered, {skipped} counted as skipped"

        raw: list[bytes] = []
        c.node.create_subscription(Tensor, "tensor", raw.append, DEEP, raw=True)
        both = settle(FrameTiming.OUTPUT_TENSOR | FrameTiming.OUTPUT_TENSOR_REF, "tensor and tensor_ref")
        c.spin_for(0.3)
        # CDR: the 4-byte encapsulation header, then header.stamp (int32 sec, uint32 nanosec).
        tensors = {sec * 1_000_000_000 + nsec for sec, nsec in (struct.unpack("<iI", r[4:12]) for r in raw)}
        assert {stamp_ns(m.header) for m in both} <= tensors, "a set with OUTPUT_TENSOR whose Tensor did not come"

        c.sub.close()
        c.sub = None
        # The node counts a subscriber as long as DDS says it is matched: the reader of a
        # consumer SIGKILLed by an earlier test (same node, same topic) stays matched until
        # its participant's lease ends (Fast DDS: 20 s), so allow for that.
        settle(FrameTiming.OUTPUT_TENSOR, "tensor only", timeout=30)
    finally:
        c.close()


def test_a_larger_output_moves_the_consumers_to_a_new_pool(node: NodeProcess, camera: Camera) -> None:
    """network_image_width doubled at run time: the node makes a larger pool (a new
    pool_id and socket); the subscription connects to it, drops the old one, whose socket
    is gone; back to the old width the tensors stay in the new pool."""
    c = Consumer(NS)
    try:
        c.spin_until(lambda: c.sub.delivered >= 3, 30, "tensor_ref frames from the camera")
        old = list(c.refs.values())[-1][0]
        srv = f"{NS}/vision_preproc"
        res = call(c, SetParameters, f"{srv}/set_parameters",
                   SetParameters.Request(parameters=[param("network_image_width", 2 * NET_W)])).results
        assert res[0].successful, res[0].reason

        def newest() -> Any:
            return list(c.refs.values())[-1][0]

        c.spin_until(lambda: newest().pool_id != old.pool_id, 10, "a TensorRef of a new pool")
        new = newest()
        assert list(new.shape) == [1, 3, NET_H, 2 * NET_W] and new.block_size >= new.byte_size > old.block_size
        n = c.sub.delivered
        c.spin_until(lambda: c.sub.delivered >= n + 3, 5, "frames of the new pool")
        assert list(c.sub.clients) == [new.pool_id], list(c.sub.clients)
        assert (c.sub.reconnects, c.sub.errors) == (0, 0) and not Path(old.socket_path).exists()
        res = call(c, SetParameters, f"{srv}/set_parameters",
                   SetParameters.Request(parameters=[param("network_image_width", NET_W)])).results
        assert res[0].successful, res[0].reason
        c.spin_until(lambda: list(newest().shape) == [1, 3, NET_H, NET_W], 10, "the old width again")
        assert newest().pool_id == new.pool_id and newest().block_size == new.block_size
    finally:
        c.close()
