"""Round trip over real DDS: an rclpy publisher sends real photographs as
sensor_msgs/Image, the node runs as its own process, an rclpy subscriber receives Tensor
and FrameTiming; the tensor values are checked against a NumPy/OpenCV computation made
here, independently of the node's code.

The same test runs against the cargo-built binary and the colcon-installed one.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from vptools.rosharness import NODE_BIN, ROOT, NodeProcess, Peer, image_msg, stamp_ns, tensor_array

from vptools.tolerances import assert_close

DATA = ROOT / "test" / "data"
NET_W, NET_H = 320, 240
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


def expected_letterbox_nchw(rgb: np.ndarray) -> tuple[np.ndarray, dict]:
    """Letterbox (centred, pad 0) + normalize + NCHW, computed from the definition:
    s = min(W/w, H/h); content = round(w*s) x round(h*s); pad split floor/ceil;
    cv2.resize(INTER_LINEAR) on float32 pixels; (p/255 - mean) / std."""
    h, w = rgb.shape[:2]
    s = min(NET_W / w, NET_H / h)
    cw, ch = min(NET_W, max(1, round(w * s))), min(NET_H, max(1, round(h * s)))
    left, top = (NET_W - cw) // 2, (NET_H - ch) // 2
    resized = cv2.resize(rgb.astype(np.float32), (cw, ch), interpolation=cv2.INTER_LINEAR)
    canvas = np.zeros((NET_H, NET_W, 3), np.float64)  # pad_value 0 in source units
    canvas[top:top + ch, left:left + cw] = resized
    norm = (canvas / 255.0 - MEAN) / STD
    geometry = dict(scale_x=cw / w, scale_y=ch / h, offset_x=left, offset_y=top)
    return norm.transpose(2, 0, 1)[None], geometry


def photos() -> list[tuple[str, np.ndarray, str, int]]:
    """(name, pixels as sent, encoding, step padding) of real photographs."""
    astronaut = cv2.cvtColor(cv2.imread(str(DATA / "astronaut.png")), cv2.COLOR_BGR2RGB)
    chelsea_bgr = cv2.imread(str(DATA / "chelsea.png"))
    rocket_bgr = cv2.imread(str(DATA / "rocket.jpg"))
    return [
        ("astronaut", astronaut, "rgb8", 0),
        ("chelsea", chelsea_bgr, "bgr8", 0),
        ("rocket", rocket_bgr, "bgr8", 8),  # padded step
    ]


def run_round_trip(binary: Path, ns: str, tmp_path: Path) -> None:
    params = [
        "-r", f"__ns:={ns}",
        "-p", f"network_image_width:={NET_W}",
        "-p", f"network_image_height:={NET_H}",
        "-p", "resize_mode:=letterbox",
        "-p", "image_mean:=[0.485, 0.456, 0.406]",
        "-p", "image_stddev:=[0.229, 0.224, 0.225]",
        "-p", "backend:=cpu",
        "-p", "tensor_name:=images",
    ]
    with NodeProcess(params, binary=binary, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        try:
            peer.wait_connected()
            for i, (name, pixels, encoding, pad) in enumerate(photos()):
                stamp = 1_700_000_000_123_456_789 + i * 33_000_000
                msg = image_msg(pixels, encoding, stamp, f"camera_{name}", step_pad=pad)
                tensor = peer.send_until_received(msg)
                rgb = pixels if encoding == "rgb8" else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
                want, geo = expected_letterbox_nchw(rgb)
                # Header, shape, layout, dtype, name, source fields.
                assert stamp_ns(tensor.header) == stamp
                assert tensor.header.frame_id == f"camera_{name}"
                assert (tensor.layout, tensor.dtype, tensor.name) == ("NCHW", "float32", "images")
                assert list(tensor.shape) == [1, 3, NET_H, NET_W]
                assert len(tensor.data) == 3 * NET_H * NET_W * 4
                assert (tensor.source_width, tensor.source_height) == (pixels.shape[1], pixels.shape[0])
                assert tensor.source_encoding == encoding
                for k, v in geo.items():
                    assert getattr(tensor, k) == pytest.approx(v, abs=1e-6), k
                # Values.
                assert_close(tensor_array(tensor), want, "float32", f"{name} ({encoding})")
                # Timing for the same frame: stages add up.
                timing = peer.timing_for(stamp)
                assert timing.backend == "cpu"
                assert timing.header.frame_id == f"camera_{name}"
                stages = timing.upload_us + timing.preprocess_us + timing.conv_us + timing.download_us
                assert 0 < timing.preprocess_us <= timing.total_us
                assert stages <= timing.total_us
                assert timing.age_us > 0  # the stamp is in the past
            seqs = [t.sequence for t in peer.timings]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
        finally:
            peer.close()
        assert node.stop() == 0, node.output()


def test_round_trip_cargo_binary(tmp_path: Path) -> None:
    run_round_trip(NODE_BIN, "/rt_cargo", tmp_path)


def test_round_trip_colcon_install(tmp_path: Path, colcon_install: Path) -> None:
    binary = colcon_install / "vision_preproc" / "lib" / "vision_preproc" / "vision_preproc_node"
    assert binary.exists(), f"colcon did not install {binary}"
    share = colcon_install / "vision_preproc" / "share" / "vision_preproc"
    for f in ["launch", "config/default.yaml", "package.xml"]:
        assert (share / f).exists(), f"colcon did not install share/vision_preproc/{f}"
    run_round_trip(binary, "/rt_colcon", tmp_path)


def test_encodings_and_sizes_through_the_node_match_the_oracle(tmp_path: Path) -> None:
    """Real photographs in several encodings and sizes (frame size and encoding changing
    from frame to frame) -> node -> tensors equal to the OpenCV oracle; header, shape,
    geometry and source fields correct; one FrameTiming per tensor whose stages add up."""
    from vptools import oracle
    from vptools.rosharness import Image
    from vptools.sources import photo_frame

    config = {"network_image_width": 128, "network_image_height": 96, "resize_mode": "center_crop",
              "output_dtype": "float16", "output_layout": "NHWC", "channel_order": "bgr",
              "image_mean": [0.4, 0.45, 0.5], "image_stddev": [0.25, 0.25, 0.25]}
    frames = [
        photo_frame("yuyv", "coffee.png", pad=6),
        photo_frame("nv21", "astronaut.png", size=(300, 200)),
        photo_frame("bayer_bggr8", "rocket.jpg"),
        photo_frame("mono16", "camera.png", big_endian=True, size=(257, 131)),
        photo_frame("bgra8", "chelsea.png", pad=4),
        photo_frame("rgb16", "coffee.png", size=(99, 77)),
    ]
    ns = "/enc"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu"] + [
        a for k, v in config.items() for a in ("-p", f"{k}:={v}")]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        try:
            peer.wait_connected()
            for i, f in enumerate(frames):
                msg = Image()
                stamp = 1_700_000_100_000_000_000 + i
                msg.header.stamp.sec, msg.header.stamp.nanosec = stamp // 10**9, stamp % 10**9
                msg.header.frame_id = "cam"
                msg.height, msg.width, msg.step = f.height, f.width, f.step
                msg.encoding, msg.is_bigendian, msg.data = f.encoding, int(f.big_endian), f.data
                t = peer.send_until_received(msg)
                want = oracle.preprocess(f.data, f.encoding, f.width, f.height, f.step, f.big_endian, config)
                assert (t.layout, t.dtype, list(t.shape)) == ("NHWC", "float16", [1, 96, 128, 3])
                assert (t.source_width, t.source_height, t.source_encoding) == (f.width, f.height, f.encoding)
                (rx, ry, rw, rh), _ = oracle.geometry(f.width, f.height, {**oracle.DEFAULTS, **config})
                assert t.scale_x == pytest.approx(128 / rw) and t.offset_x == pytest.approx(-rx * 128 / rw, abs=1e-4)
                assert t.scale_y == pytest.approx(96 / rh) and t.offset_y == pytest.approx(-ry * 96 / rh, abs=1e-4)
                assert_close(tensor_array(t), want, "float16", f"node {f.encoding} {f.width}x{f.height}")
                tm = peer.timing_for(stamp)
                stages = tm.upload_us + tm.preprocess_us + tm.conv_us + tm.download_us
                assert stages <= tm.total_us <= tm.age_us, tm
            assert len(peer.timings) == len(peer.tensors)
        finally:
            peer.close()
        assert node.stop() == 0


def test_backend_auto_falls_back_and_cuda_refuses_without_a_gpu(tmp_path: Path) -> None:
    """On a machine without a GPU: backend auto runs on the CPU and says so (log and
    diagnostics WARN); backend cuda refuses to start with the reason."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

    from vptools.rosharness import RELIABLE

    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA GPU")
    with NodeProcess(["-p", "backend:=cuda"], log=tmp_path / "cuda.log") as node:
        rc = node.proc.wait(timeout=20)
    assert rc == 1 and "no usable GPU" in node.output(), node.output()

    ns = "/auto"
    with NodeProcess(["-r", f"__ns:={ns}", "-p", "backend:=auto"], log=tmp_path / "auto.log") as node:
        peer = Peer(ns)
        statuses: list = []
        peer.node.create_subscription(DiagnosticArray, "/diagnostics",
                                      lambda m: statuses.extend(s for s in m.status if s.name == "auto/vision_preproc"),
                                      RELIABLE)
        try:
            peer.wait_connected()
            bgr = cv2.imread(str(DATA / "chelsea.png"))
            t = peer.send_until_received(image_msg(bgr, "bgr8", 7_000_000_001, "cam"))
            assert peer.timing_for(7_000_000_001).backend == "cpu"
            peer.spin_until(lambda: len(statuses) >= 1, 5, "diagnostics")
            s = statuses[-1]
            kv = {v.key: v.value for v in s.values}
            assert s.level == DiagnosticStatus.WARN and "running on the CPU" in s.message, s
            assert kv["Backend"] == "cpu" and "libcuda" in kv["Backend fallback reason"], kv
            assert list(t.shape) == [1, 3, 480, 640]
        finally:
            peer.close()
        assert node.stop() == 0
    assert "using the CPU backend" in node.output()
