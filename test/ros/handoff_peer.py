"""Consumer processes of the node's shared pool for test_handoff.py (run with the test's
environment: its ROS_DOMAIN_ID), each printing what it did on stdout:

    hold TOPIC             takes every frame of TOPIC (a `tensor_ref`) and never gives it
                           back ("held N" at each), until killed
    slow TOPIC SECONDS     a slow network: holds each frame 500 ms inside the callback,
                           its bytes checked unchanged at the end; then a JSON summary
    greedy TOPIC SECONDS   keeps every frame it can take for 500 ms without waiting (a
                           pipeline that never lets the node have a block); a JSON summary
                           (both print "first frame" at their first and run SECONDS from it)
    plain PATH N           N socket-level clients of the pool at PATH (no ROS, no
                           vision_preproc_consumer), client i holding block i % blocks,
                           the odd ones upgraded to the ready signal (never reading it);
                           "holding N", then sleeps until killed

`plain_client` is also what test_handoff.py uses in its own process.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import socket
import struct
import sys
import time
import zlib

HOLD_S = 0.5


def plain_client(path: str, block: int, upgrade: bool = False) -> tuple[socket.socket, dict, mmap.mmap]:
    """Connect to the pool's socket, read the hello (4-byte length + JSON, the fds with
    it), map the control block, add 1 to this client's hold of `block` and close the fds;
    with `upgrade`, ask for the ready signal (protocol 2's UPGRADE; nothing is read after).
    Returns the open socket, the hello and the control mapping (the caller closes both)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    buf, fds = b"", []
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("<I", buf[:4])[0]:
        data, got, _, _ = socket.recv_fds(s, 1 << 16, 256)
        assert data, f"{path}: closed during the hello"
        buf, fds = buf + data, fds + got
    hello = json.loads(buf[4:])
    assert "error" not in hello, hello
    assert len(fds) == 1 + hello["blocks"], (len(fds), hello)
    ctrl = mmap.mmap(fds[0], hello["control_size"])
    for fd in fds:
        os.close(fd)
    b = block % hello["blocks"]
    hold = ctypes.c_uint32.from_buffer(ctrl, hello["holds_offset"] + hello["row"] * hello["row_stride"] + 4 * b)
    hold.value += 1  # (this client is its row's only writer)
    del hold
    if upgrade:
        body = json.dumps({"version": 2, "name": f"plain {block}"}).encode()
        s.sendall(struct.pack("<IHH", len(body) + 4, 1, 0) + body)
    return s, hello, ctrl


def checksum(array) -> int:
    return zlib.crc32(memoryview(array).cast("B"))


def main() -> int:
    mode = sys.argv[1]
    if mode == "plain":
        path, n = sys.argv[2], int(sys.argv[3])
        clients = [plain_client(path, i, upgrade=i % 2 == 1) for i in range(n)]
        print(f"holding {len(clients)}", flush=True)
        time.sleep(120)
        return 0

    import rclpy
    from vision_preproc_consumer import TensorRefSubscription

    topic = sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3600.0
    rclpy.init()
    node = rclpy.create_node(f"handoff_{mode}_{os.getpid()}")
    held: list = []  # (frame, checksum at take, when taken)
    summary = {"mode": mode, "held": 0, "changed_while_held": 0, "hold_s": []}

    def on_frame(frame) -> None:
        nonlocal end
        if end is None:
            end = time.monotonic() + seconds
            print("first frame", flush=True)
        a = frame.array()
        if mode == "hold":
            held.append(frame)
            print(f"held {len(held)} block {frame.msg.block_index}", flush=True)
        elif mode == "slow":
            before, t = checksum(a), time.monotonic()
            time.sleep(HOLD_S)
            summary["changed_while_held"] += checksum(a) != before
            summary["hold_s"].append(time.monotonic() - t)
            summary["held"] += 1
            frame.release()
        else:
            held.append((frame, checksum(a), time.monotonic()))

    end: float | None = None
    sub = TensorRefSubscription(node, topic, on_frame, 10)
    give_up = time.monotonic() + 60  # (no frame at all)
    while time.monotonic() < (end if end is not None else give_up):
        rclpy.spin_once(node, timeout_sec=0.01)
        if mode == "greedy":
            while held and time.monotonic() - held[0][2] >= HOLD_S:
                frame, before, t = held.pop(0)
                summary["changed_while_held"] += checksum(frame.array()) != before
                summary["hold_s"].append(time.monotonic() - t)
                summary["held"] += 1
                frame.release()
    summary.update(received=sub.received, delivered=sub.delivered, skipped=sub.skipped,
                   withdrawn=sub.withdrawn, reconnects=sub.reconnects, errors=sub.errors)
    print(json.dumps(summary), flush=True)
    sub.close()
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
