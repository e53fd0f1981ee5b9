"""The C/C++ consumer (consumer_c/, docs/HANDOFF.md, *C and C++*) against the node, on the
CPU machine (host blocks): `examples/tensor_ref_consumer.cpp`, built by CMake into
target/consumer_c/ (scripts/test.sh's `consumer_c` stage), connects to the node's pool
socket without ROS, waits for each tensor on the socket's ready signal (protocol version
2), sums |x| over it in place and dumps each frame's stamp, FNV-1a of its bytes and sum.

Checked: every frame it read is, byte for byte, the `Tensor` the node published for the
same stamp (the output the parity suite checks against OpenCV), its sum equals NumPy's
over that tensor, camera stamp -> usable is positive, the geometry it printed and the
network image mapped back with `vp::to_source` equal the TensorRef's item and the Python
`to_source` of it; the node lists it as a consumer on the ready signal with its reports
(`/diagnostics`) and counts no bad client. Then the version 1 path (`consumer_c/test/take.cpp`:
connected without the ready signal, fed the descriptors the peer receives on the topic,
taken with `vp::Consumer::acquire`): every tensor taken is the `Tensor` of its stamp. The
rclpy peer subscribes to `tensor` (the reference) and publishes the camera's photographs;
while the C++ example reads, nothing subscribes to `tensor_ref` on DDS (a consumer on the
ready signal is enough for the node to write blocks); the version 1 path then does.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from vptools import ROOT
from vptools.rosharness import RELIABLE, NodeProcess, Peer, frame_msg, stamp_ns, tensor_array
from vptools.sources import photo_frame

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from vision_preproc_consumer import to_source  # noqa: E402
from vision_preproc_msgs.msg import TensorRef  # noqa: E402

NS = "/consumer_c"
NET_W, NET_H = 161, 120
EXAMPLE = ROOT / "target" / "consumer_c" / "tensor_ref_consumer_cpp"
#: consumer_c/test/take.cpp: the version 1 path (descriptors from the topic, fed on stdin).
TAKE = ROOT / "target" / "consumer_c" / "consumer_c_take"
#: Frames the camera sends (at ~30 Hz), and how long the example reads.
FRAMES = 40
READ_S = 5.0
#: The C++ sum of |x| (double, in order) against NumPy's (pairwise): relative.
SUM_REL = 1e-9


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def publish(peer: Peer, frames: int) -> None:
    """`frames` photographs at ~30 Hz into the node, spinning the peer meanwhile."""
    frame = photo_frame("bgr8", "chelsea.png")
    t0 = time.time_ns()
    for i in range(frames):
        peer.pub.publish(frame_msg(frame, t0 + i * 33_000_000, "camera"))
        deadline = time.monotonic() + 0.033
        while time.monotonic() < deadline:
            peer.executor.spin_once(timeout_sec=0.005)


def take_from_the_topic(peer: Peer, refs: dict[int, TensorRef], env: dict, lines: list[str]) -> None:
    """The version 1 path: consumer_c_take on the pool's socket, fed each TensorRef the
    peer receives (its output lines into `lines`)."""
    sockets = list((Path(env["XDG_RUNTIME_DIR"]) / "vision_preproc").glob("*.sock"))
    assert len(sockets) == 1, sockets
    socket_path = str(sockets[0])
    take = subprocess.Popen([str(TAKE), socket_path], env=dict(os.environ, **env), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    reader = threading.Thread(target=lambda: lines.extend(take.stdout), daemon=True)
    reader.start()

    def feed(m: TensorRef) -> None:
        refs[stamp_ns(m.header)] = m
        take.stdin.write(f"{stamp_ns(m.header)} {m.block_index} {m.generation} {m.memory_kind} {m.byte_offset} "
                         f"{m.byte_size}\n")
        take.stdin.flush()

    sub = peer.node.create_subscription(TensorRef, "tensor_ref", feed, 10)
    peer.spin_until(lambda: any("protocol version" in line for line in lines) or take.poll() is not None, 10.0,
                    "consumer_c_take to connect")
    publish(peer, FRAMES // 2)
    peer.node.destroy_subscription(sub)
    take.stdin.close()
    assert take.wait(timeout=10) == 0, "".join(lines)
    reader.join(timeout=5)


def test_cpp_consumer_reads_the_tensors_in_place(tmp_path: Path, run_dir: Path) -> None:
    if not EXAMPLE.exists() or not TAKE.exists():
        pytest.fail(f"{EXAMPLE} is missing: build consumer_c (scripts/test.sh's consumer_c stage: "
                    "cmake -S consumer_c -B target/consumer_c && cmake --build target/consumer_c)")
    env = {"XDG_RUNTIME_DIR": str(run_dir)}  # this node's socket only: the example finds it ("auto")
    args = ["-r", f"__ns:={NS}", "-p", "backend:=cpu", "-p", f"network_image_width:={NET_W}",
            "-p", f"network_image_height:={NET_H}", "-p", "resize_mode:=letterbox"]
    peer = Peer(NS, output_qos=RELIABLE)
    refs: dict[int, TensorRef] = {}
    statuses: list = []
    peer.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status), RELIABLE)
    dump = tmp_path / "dump.txt"
    with NodeProcess(args, env=env, log=tmp_path / "node.log") as node:
        try:
            peer.wait_connected()
            example = subprocess.Popen([str(EXAMPLE), "auto", str(READ_S), str(dump)], env=dict(os.environ, **env),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(example.stdout), daemon=True)
            reader.start()
            peer.spin_until(lambda: any("protocol version" in line for line in lines) or example.poll() is not None,
                            15.0, "the example to connect")
            publish(peer, FRAMES)
            assert example.wait(timeout=READ_S + 20) == 0, "".join(lines)
            reader.join(timeout=5)
            peer.spin_until(lambda: any("tensor_ref_consumer_cpp" in s.name for s in statuses), 5.0,
                            "the consumer's status in /diagnostics")
            taken: list[str] = []
            take_from_the_topic(peer, refs, env, taken)
        finally:
            peer.close()
            assert node.stop() == 0, node.output()[-3000:]
    out = "".join(lines)
    assert "host memory, protocol version 2" in out, out
    tensors = {stamp_ns(t.header): t for t in peer.tensors}
    rows = [line.split() for line in dump.read_text().splitlines()]
    assert len(rows) >= FRAMES // 2, (len(rows), out)
    checked = 0
    for stamp, fnv, total, age in rows:
        t = tensors.get(int(stamp))
        if t is None:
            continue
        assert int(fnv, 16) == fnv1a(bytes(t.data)), f"stamp {stamp}: the C++ consumer's bytes are not the Tensor's"
        want = float(np.abs(tensor_array(t).astype(np.float64)).sum())
        assert abs(float(total) - want) <= SUM_REL * want, (stamp, total, want)
        assert int(age) > 0, age
        checked += 1
    assert checked >= FRAMES // 2, (checked, len(rows), len(tensors))
    # The geometry and the network image mapped back: the same as Python's to_source.
    m = re.search(r"network image -> source \[([-\d. ]+)\]", out)
    assert m, out
    item = next(iter(refs.values())).items[0]
    want = to_source([[0, 0, NET_W, NET_H]], item, "xyxy")[0]
    np.testing.assert_allclose([float(v) for v in m.group(1).split()], want, atol=1e-5)
    assert abs(want[2] - want[0] - 451) < 1e-3 and want[1] < 0, want  # letterbox: pad above and below
    # The node's view: this consumer on the ready signal, its reports counted, no bad client.
    mine = [s for s in statuses if "consumer tensor_ref_consumer_cpp" in s.name]
    reported = max(int({kv.key: kv.value for kv in s.values}.get("Frames reported (window)", 0)) for s in mine)
    assert reported > 0, [(s.name, [(kv.key, kv.value) for kv in s.values]) for s in mine]
    node_status = [{kv.key: kv.value for kv in s.values} for s in statuses if s.name.endswith("vision_preproc")]
    assert node_status and all(v.get("Shared bad clients", "0") == "0" for v in node_status), node_status
    # The version 1 path: descriptors from the topic, taken through acquire(), the Tensor's bytes.
    assert taken and taken[0].strip() == "protocol version 1", taken
    got = [line.split() for line in taken[1:]]
    read = [(int(stamp), fnv) for stamp, fnv in got if fnv != "skipped"]
    assert len(read) >= FRAMES // 4, taken
    for stamp, fnv in read:
        if stamp in tensors:
            assert int(fnv, 16) == fnv1a(bytes(tensors[stamp].data)), f"stamp {stamp}: taken from the topic"
    assert sum(stamp in tensors for stamp, _ in read) >= FRAMES // 4, (read, sorted(tensors))
