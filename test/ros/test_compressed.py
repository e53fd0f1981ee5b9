"""Compressed inputs through real DDS: an rclpy camera publishes sensor_msgs/CompressedImage
on `image/compressed` (image_transport's compressed transport) to the node, started with
`image_transport: compressed` in its own process.

Payloads are photographs of test/data encoded by OpenCV and Pillow (python/vptools/
compressed.py): JPEG at several qualities, 4:2:0 / 4:2:2 / 4:4:4, baseline and progressive,
grey, an MJPEG frame without Huffman tables (usb_cam's pass-through `jpeg`); PNG 8-bit
colour, RGBA, palette and 16-bit grey (`16UC1; png compressed`). Every tensor must equal
the OpenCV oracle (python/vptools/oracle.py) fed the pixels of our CPU decoder for the
same payload (`vision_preproc decode-file`: the spec's input for compressed frames), within
the float32 tolerance; that decoder's own agreement with OpenCV's decode is
test/python/test_compressed_decode.py's.

Then a fuzz corpus of damaged payloads (truncated, flipped bytes, lying headers, an
unknown format), each followed by a good frame: each damaged payload is refused by the node
exactly when our decoder refuses it, with its cause counted in /diagnostics and its reason
as `Last rejection reason`; a payload the decoder accepts (flipped bytes inside the
entropy-coded data) is published as the decoder's pixels; the good frame after each is
correct; the books balance and the node never stops.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from sensor_msgs.msg import CompressedImage

from vptools import oracle
from vptools.compressed import (BIN, Image, cv_jpeg, photo, pil_jpeg, run_decoder, with_declared_size,
                                without_huffman_tables)
from vptools.rosharness import RELIABLE, NodeProcess, Peer, stamp_ns, tensor_array
from vptools.rosharness import frame_counts as counts
from vptools.rosharness import status_values as kv
from vptools.tolerances import assert_close

NS = "/compressed_in"
STATUS_NAME = "compressed_in/vision_preproc"
CONFIG = {"network_image_width": 96, "network_image_height": 64, "resize_mode": "letterbox"}
#: Bytes per sample of the encodings our decoder gives.
ENCODINGS = {"rgb8": (3, 1), "rgba8": (4, 1), "mono8": (1, 1), "mono16": (1, 2), "rgb16": (3, 2)}


def good_payloads() -> list[tuple[str, str, bytes]]:
    """(id, format, payload) of the frames the node must turn into tensors."""
    chelsea, rocket, grey = photo("chelsea.png"), photo("rocket.jpg"), photo("camera.png", grey=True)
    rng = np.random.default_rng(5)
    grey16 = (grey.astype(np.uint16) * 257 + rng.integers(0, 256, grey.shape)).astype(np.uint16)
    bgra = cv2.cvtColor(chelsea, cv2.COLOR_BGR2BGRA)
    bgra[..., 3] = 200
    png = lambda img: cv2.imencode(".png", img)[1].tobytes()  # noqa: E731
    cases = [
        ("cv-q50-420", "bgr8; jpeg compressed bgr8", cv_jpeg(chelsea, 50, "420", False)),
        ("cv-q90-422-progressive", "rgb8; jpeg compressed bgr8", cv_jpeg(rocket, 90, "422", True)),
        ("cv-q95-444", "bgr8; jpeg compressed bgr8", cv_jpeg(chelsea, 95, "444", False)),
        ("cv-grey", "mono8; jpeg compressed mono8", cv_jpeg(grey, 80, "444", False)),
        ("mjpeg-no-huffman-tables", "jpeg", without_huffman_tables(cv_jpeg(rocket, 80, "420", False))),
        ("png-rgb8", "bgr8; png compressed bgr8", png(chelsea)),
        ("png-rgba8", "bgra8; png compressed bgra8", png(bgra)),
        ("png-16UC1", "16UC1; png compressed", png(grey16)),
    ]
    if Image is not None:
        cases.append(("pil-q85-420", "jpeg", pil_jpeg("astronaut.png", 85, 2, False)))
        cases.append(("pil-q85-444-progressive", "jpeg", pil_jpeg("chelsea.png", 85, 0, True)))
    return cases


def damaged_payloads() -> list[tuple[str, str, bytes]]:
    """(id, format, payload) of the fuzz corpus: truncated, flipped, lying, mislabelled."""
    jpeg = cv_jpeg(photo("chelsea.png"), 80, "420", False)
    prog = cv_jpeg(photo("rocket.jpg"), 80, "420", True)
    png = cv2.imencode(".png", photo("chelsea.png"))[1].tobytes()
    cases = [(f"{label}-cut-{frac}", fmt, data[:int(len(data) * frac)])
             for label, data, fmt in [("jpeg", jpeg, "jpeg"), ("progressive", prog, "jpeg"), ("png", png, "png")]
             for frac in (0.0, 0.02, 0.5, 0.98)]
    cases += [
        ("jpeg-declares-100000x100000", "jpeg", with_declared_size(jpeg, 100000, 100000)),
        ("png-declares-100000x100000", "png", with_declared_size(png, 100000, 100000)),
        ("png-declares-0x300", "png", with_declared_size(png, 0, 300)),
        ("png-labelled-jpeg", "jpeg", png),
        ("compressedDepth", "16UC1; compressedDepth png", png),
        ("empty", "jpeg", b""),
    ]
    rng = np.random.default_rng(11)
    for label, data, fmt in [("jpeg", jpeg, "jpeg"), ("progressive", prog, "jpeg"), ("png", png, "png")]:
        for trial in range(4):
            b = bytearray(data)
            for at in rng.integers(0, len(b), 1 + trial):
                b[at] ^= int(rng.integers(1, 256))
            cases.append((f"{label}-flipped-{trial}", fmt, bytes(b)))
    return cases


def ours(tmp: Path, fmt: str, payload: bytes) -> tuple[int, dict, bytes]:
    """Our CPU decoder's answer for a payload: (exit code 0 or 2, its JSON line, pixels)."""
    assert BIN.exists(), f"{BIN} is missing: run scripts/test_hooks_build.sh (make test does)"
    return run_decoder(BIN, tmp, fmt, payload)


def compressed_msg(fmt: str, payload: bytes, stamp: int) -> CompressedImage:
    m = CompressedImage()
    m.header.stamp.sec, m.header.stamp.nanosec = stamp // 10**9, stamp % 10**9
    m.header.frame_id = "mjpeg_camera"
    m.format, m.data = fmt, payload
    return m


class Camera:
    """The rclpy camera, the node's diagnostics and the tallies."""

    def __init__(self, peer: Peer, tmp: Path) -> None:
        self.peer, self.tmp = peer, tmp
        self.statuses: list[DiagnosticStatus] = []
        peer.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: self.statuses.extend(s for s in m.status if s.name == STATUS_NAME), RELIABLE)
        self.stamp = 1_700_000_000_000_000_000
        self.rejected = 0
        self.causes: dict[str, int] = {}
        self.checked = 0

    def next_stamp(self) -> int:
        self.stamp += 1_000_000
        return self.stamp

    def good(self, what: str, fmt: str, payload: bytes) -> None:
        """Send a frame our decoder accepts; its tensor must be the oracle of those pixels."""
        rc, head, pixels = ours(self.tmp, fmt, payload)
        assert rc == 0, f"{what}: {head}"
        stamp = self.next_stamp()
        t = self.peer.send_until_received(compressed_msg(fmt, payload, stamp), timeout=15.0)
        w, h, enc = head["width"], head["height"], head["encoding"]
        want = oracle.preprocess(pixels, enc, w, h, head["step"], False, CONFIG)
        assert (t.source_width, t.source_height, t.source_encoding) == (w, h, fmt), what
        assert_close(tensor_array(t), want, "float32", f"{what}: {fmt} {w}x{h} -> {enc}")
        timing = self.peer.timing_for(stamp)
        assert timing.decode_us > 0.0, f"{what}: decode_us {timing.decode_us}"
        assert timing.header.frame_id == "mjpeg_camera", what
        self.checked += 1

    def damaged(self, what: str, fmt: str, payload: bytes) -> None:
        """Send a damaged payload: refused by the node exactly when our decoder refuses it,
        counted by cause; else published as the decoder's pixels. The first payload of each
        cause waits for the /diagnostics status that counts it (1 Hz: its reason and the
        counts by cause checked there); the others are counted in the final books."""
        rc, head, _ = ours(self.tmp, fmt, payload)
        if rc == 0:
            self.good(what, fmt, payload)
            return
        self.peer.pub.publish(compressed_msg(fmt, payload, self.next_stamp()))
        self.rejected += 1
        first = head["error"] not in self.causes
        self.causes[head["error"]] = self.causes.get(head["error"], 0) + 1
        if not first:
            return
        want = self.rejected
        self.peer.spin_until(
            lambda: bool(self.statuses) and counts(self.statuses[-1])["Frames rejected (invalid)"] >= want,
            8.0, f"{what}: /diagnostics counting rejection #{want}")
        status = self.statuses[-1]
        c, values = counts(status), kv(status)
        assert c["Frames rejected (invalid)"] == want and c["Frames failed (error)"] == 0, (what, c)
        assert head["message"] in values["Last rejection reason"], (what, head, values["Last rejection reason"])
        assert values["Compressed frames undecodable (by cause)"] == self.by_cause(), (what, values)
        assert status.level == DiagnosticStatus.ERROR, (what, status.message)

    def by_cause(self) -> str:
        """The node's `Compressed frames undecodable (by cause)` for the refusals so far."""
        return ", ".join(f"{k}: {n}" for k, n in sorted(self.causes.items()))


def test_compressed_frames_equal_the_spec_and_damaged_ones_are_refused_by_cause(tmp_path: Path) -> None:
    args = ["-r", f"__ns:={NS}", "-p", "backend:=cpu", "-p", "image_transport:=compressed",
            "-p", "input_qos:=default", "-p", "input_qos_depth:=10"]
    args += [a for k, v in CONFIG.items() for a in ("-p", f"{k}:={v}")]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(NS, image_qos=RELIABLE, transport="compressed")
        cam = Camera(peer, tmp_path)
        try:
            peer.wait_connected()
            assert peer.node.count_subscribers(f"{NS}/image") == 0, "a raw subscription with transport compressed"
            for what, fmt, payload in good_payloads():
                cam.good(what, fmt, payload)
            good_fmt, good = "jpeg", cv_jpeg(photo("astronaut.png"), 80, "420", False)
            for what, fmt, payload in damaged_payloads():
                cam.damaged(what, fmt, payload)
                cam.good(f"the good frame after {what}", good_fmt, good)
            n = len(cam.statuses)
            peer.spin_until(
                lambda: len(cam.statuses) > n and counts(cam.statuses[-1])["Frames published"] == len(peer.tensors),
                10.0, "a /diagnostics status counting every tensor received")
            status = cam.statuses[-1]
            final, values = counts(status), kv(status)
            assert final["Frames received"] == final["Frames published"] + final["Frames dropped (queue)"] \
                + final["Frames rejected (invalid)"] + final["Frames failed (error)"], final
            assert final["Frames rejected (invalid)"] == cam.rejected >= 12, (final, cam.causes)
            assert values["Compressed frames undecodable (by cause)"] == cam.by_cause(), values
            assert final["Frames published"] == len(peer.tensors) >= cam.checked, final
            assert {"truncated", "too_large", "zero_size", "signature", "unknown_format"} <= set(cam.causes), cam.causes
            assert values["Input transport"].startswith("compressed"), values
            assert values["Input topic"] == f"{NS}/image/compressed", values
            assert values["Compressed frames decoded"].startswith("on the CPU"), values
            assert node.proc.poll() is None, "node exited"
        finally:
            peer.close()
        assert node.stop() == 0, node.output()[-3000:]
    log = (tmp_path / "node.log").read_text()
    assert "undecodable compressed image" in log, log[-2000:]
    assert "panicked" not in log, log[-3000:]


def test_a_batch_mixes_a_compressed_and_a_raw_camera(tmp_path: Path) -> None:
    """`inputs` of two topics, `input_transports: [compressed, ""]`: the first camera's JPEG
    and the second's raw frame go into one TensorBatch (approximate_time on equal stamps),
    each item equal to its own oracle; the raw topic is not subscribed as compressed."""
    from sensor_msgs.msg import Image as RawImage
    from vptools.rosharness import image_msg

    ns = "/compressed_batch"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", 'inputs:=["front/image", "rear/image"]',
            "-p", 'input_transports:=["compressed", ""]', "-p", "batch_policy:=approximate_time",
            "-p", "input_qos:=default"]
    args += [a for k, v in CONFIG.items() for a in ("-p", f"{k}:={v}")]
    jpeg = cv_jpeg(photo("chelsea.png"), 85, "420", False)
    rc, head, pixels = ours(tmp_path, "jpeg", jpeg)
    assert rc == 0, head
    rear = photo("rocket.jpg")
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns, publish_images=False, batch=True)
        batches = peer.tensors
        front_pub = peer.node.create_publisher(CompressedImage, "front/image/compressed", RELIABLE)
        rear_pub = peer.node.create_publisher(RawImage, "rear/image", RELIABLE)
        try:
            peer.spin_until(lambda: front_pub.get_subscription_count() >= 1 and rear_pub.get_subscription_count() >= 1,
                            20.0, "the node's two subscriptions")
            assert peer.node.count_subscribers(f"{ns}/front/image") == 0
            assert peer.node.count_subscribers(f"{ns}/rear/image/compressed") == 0
            # A pair of frames with one stamp every 0.5 s until a batch of both arrives (the
            # first may go out before this peer's tensor reader matched the node's writer).
            stamp = 1_700_000_000_000_000_000
            for _ in range(30):
                stamp += 500_000_000
                front_pub.publish(compressed_msg("jpeg", jpeg, stamp))
                rear_pub.publish(image_msg(rear, "bgr8", stamp, "rear"))
                try:
                    peer.spin_until(lambda: any(all(it.valid for it in b.items) for b in batches), 0.5, "")
                    break
                except AssertionError:
                    continue
            full = [b for b in batches if all(it.valid for it in b.items)]
            assert full, f"no batch with both cameras in 15 s ({len(batches)} batches)"
            b = full[0]
            assert stamp_ns(b.items[0].header) == stamp_ns(b.items[1].header), "a set of one stamp"
            assert (b.items[0].source_encoding, b.items[1].source_encoding) == ("jpeg", "bgr8")
            whole = tensor_array(b)
            assert_close(whole[0:1], oracle.preprocess(pixels, head["encoding"], head["width"], head["height"],
                                                       head["step"], False, CONFIG), "float32", "compressed item")
            assert_close(whole[1:2], oracle.preprocess(rear.tobytes(), "bgr8", rear.shape[1], rear.shape[0],
                                                       rear.shape[1] * 3, False, CONFIG), "float32", "raw item")
        finally:
            peer.close()
        assert node.stop() == 0, node.output()[-3000:]
