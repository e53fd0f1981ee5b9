"""Live replay: `vision_preproc play` publishes a bag (written by rosbags) -> the node, in
its own process, over real DDS -> an rclpy subscriber records the tensors; they are the
same bytes as the offline `replay` of the same bag on the same backend (CPU)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from vptools.bags import read_outputs, write_bag
from vptools.rosharness import ROOT, NodeProcess, Peer, stamp_ns
from vptools.sources import photo_frame

CLI = ROOT / "target" / "release" / "vision_preproc"


def test_play_into_the_node_equals_offline_replay(tmp_path: Path) -> None:
    frames = [
        photo_frame("bgr8", "chelsea.png"),
        photo_frame("yuyv", "coffee.png", size=(320, 214)),
        photo_frame("nv12", "astronaut.png", size=(256, 256)),
        photo_frame("bayer_grbg8", "rocket.jpg"),
        photo_frame("mono8", "camera.png", size=(200, 150)),
    ]
    stamps = write_bag(tmp_path / "in", frames, storage="mcap", period_ns=200_000_000)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("vision_preproc:\n  ros__parameters:\n    network_image_width: 160\n"
                   "    network_image_height: 120\n    output_dtype: float16\n    output_layout: NHWC\n"
                   "    backend: cpu\n")
    ns = "/live"
    with NodeProcess(["-r", f"__ns:={ns}", "--params-file", str(cfg)], log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        try:
            peer.wait_connected()
            play = subprocess.run([str(CLI), "play", str(tmp_path / "in"), "--image-topic", f"{ns}/image",
                                   "--camera-info-topic", f"{ns}/camera_info", "--wait-subscribers", "1"],
                                  capture_output=True, text=True, timeout=60)
            assert play.returncode == 0, play.stderr
            assert f"play: {len(frames)} images, {len(frames)} camera infos published, 0 skipped" in play.stdout, play.stdout
            peer.spin_until(lambda: {stamp_ns(t.header) for t in peer.tensors} >= set(stamps), 15,
                            "a tensor for every played frame")
            live = {stamp_ns(t.header): bytes(t.data) for t in peer.tensors}
        finally:
            peer.close()
        assert node.stop() == 0
    p = subprocess.run([str(CLI), "replay", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    offline, _ = read_outputs(tmp_path / "out")
    assert len(offline) == len(frames)
    for t in offline:
        s = t.header.stamp.sec * 10**9 + t.header.stamp.nanosec
        assert live[s] == t.data.tobytes(), f"frame {s}: live tensor differs from offline replay"


def test_loop_keeps_the_recorded_rate(tmp_path: Path) -> None:
    """A looped bag plays at its recorded rate: after its last frame the next pass starts
    one frame period later (it used to start at once: 5 frames at 30 Hz looped at 37.5 Hz).
    The schedule is absolute (a late frame is sent at once, the next on time), so the count
    over a fixed duration is the rate, within the frames at the two ends."""
    frames = [photo_frame("rgb8", "chelsea.png", size=(64, 48)) for _ in range(5)]
    write_bag(tmp_path / "in", frames, storage="mcap", period_ns=33_333_333, with_camera_info=False)
    for rate, expected in ((1.0, 60), (2.0, 120)):
        p = subprocess.run([str(CLI), "play", str(tmp_path / "in"), "--loop", "--duration", "2",
                            "--rate", str(rate), "--image-topic", "/loop_test/image"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        n = int(p.stdout.split("play: ")[1].split(" images")[0])
        assert expected - 3 <= n <= expected + 1, f"--rate {rate}: {n} images in 2 s, expected {expected}: {p.stdout}"
