"""Live replay: `vision_preproc play` publishes a bag (written by rosbags; raw or
compressed images) -> the node, in its own process, over real DDS -> an rclpy subscriber
records the tensors; they are the same bytes as the offline `replay` of the same bag on
the same backend (CPU)."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from vptools.bags import read_outputs, write_bag
from vptools.compressed import Payload, cv_jpeg, cv_png, photo, without_huffman_tables
from vptools.rosharness import ROOT, NodeProcess, Peer, stamp_ns
from vptools.sources import photo_frame

CLI = ROOT / "target" / "release" / "vision_preproc"


def play_until_every_stamp(peer: Peer, bag: Path, ns: str, stamps: list[int]) -> str:
    """`play --loop` the bag into the node in `ns` until the peer has a tensor of every
    stamp, then stop it with SIGINT; its summary. Looped, not played once: a frame
    published before the node's subscription has matched play's publisher is lost (best
    effort, as a camera's), one that comes while a loaded machine holds the node back is
    dropped (and counted), and what is asserted here is the tensors' bytes (CI's run of a
    single pass once missed a frame). The loop repeats the recorded stamps, so a stamp's
    tensor is the same frame's in every pass."""
    p = subprocess.Popen([str(CLI), "play", str(bag), "--loop", "--image-topic", f"{ns}/image",
                          "--camera-info-topic", f"{ns}/camera_info", "--wait-subscribers", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        peer.spin_until(lambda: {stamp_ns(t.header) for t in peer.tensors} >= set(stamps), 30,
                        "a tensor for every played frame")
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=15)
    assert p.returncode == 0, err
    m = re.search(r"play: (\d+) images, (\d+) camera infos published, 0 skipped", out)
    # Stopped between a frame's camera info and its image, the infos are one ahead.
    assert m and int(m[1]) >= len(stamps) and int(m[2]) - int(m[1]) in (0, 1), out
    return out


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
            play_until_every_stamp(peer, tmp_path / "in", ns, stamps)
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


def test_play_of_a_compressed_bag_into_a_compressed_node_equals_offline_replay(tmp_path: Path) -> None:
    """A bag's `sensor_msgs/CompressedImage` topic (as datasets record
    `image_raw/compressed`): `play --image-topic <ns>/image` publishes it on
    `<ns>/image/compressed`, where a node with `image_transport: compressed` reading `image`
    subscribes (image_transport's rule); its tensors are the bytes of the offline `replay`
    of the same bag, with the format as `source_encoding`. `record` beside the peer reports
    the decode stage (`FrameTiming.decode_us`) with the others."""
    import json

    payloads = [
        Payload("bgr8; jpeg compressed bgr8", cv_jpeg(photo("chelsea.png"), 80, "420", False)),
        Payload("jpeg", without_huffman_tables(cv_jpeg(photo("coffee.png"), 90, "422", False))),
        Payload("bgr8; png compressed bgr8", cv_png(photo("rocket.jpg"))),
        Payload("mono8; jpeg compressed mono8", cv_jpeg(photo("camera.png", grey=True), 90, "444", True)),
    ]
    stamps = write_bag(tmp_path / "in", payloads, storage="mcap", topic="/cam/image_raw/compressed",
                       period_ns=200_000_000)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("vision_preproc:\n  ros__parameters:\n    network_image_width: 160\n"
                   "    network_image_height: 120\n    backend: cpu\n    image_transport: compressed\n")
    ns = "/live_compressed"
    with NodeProcess(["-r", f"__ns:={ns}", "--params-file", str(cfg), "-p", "image_transport:=compressed",
                      "-p", "backend:=cpu"], log=tmp_path / "node.log") as node:
        peer = Peer(ns, publish_images=False)
        record = subprocess.Popen([str(CLI), "record", "--count-only", "--tensor-topic", f"{ns}/tensor",
                                   "--timing-topic", f"{ns}/timing", "--json", str(tmp_path / "rec.json")],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            peer.spin_until(lambda: peer.node.count_publishers(f"{ns}/tensor") >= 1
                            and peer.node.count_subscribers(f"{ns}/timing") >= 2, 20, "the node and record on DDS")
            played = play_until_every_stamp(peer, tmp_path / "in", ns, stamps)
            assert f"images on {ns}/image/compressed" in played, played
            live = {stamp_ns(t.header): t for t in peer.tensors}
        finally:
            record.send_signal(signal.SIGINT)
            recorded = record.communicate(timeout=15)[0]
            peer.close()
        assert node.stop() == 0
    assert record.returncode == 0 and "stages p50 (p99), ms: decode " in recorded, recorded
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["timings"] >= 1 and rec["stages_ms_p50"]["decode"] > 0 and rec["stages_ms_p99"]["decode"] > 0, rec
    p = subprocess.run([str(CLI), "replay", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    offline, _ = read_outputs(tmp_path / "out")
    assert len(offline) == len(payloads)
    for t, payload in zip(offline, payloads):
        s = t.header.stamp.sec * 10**9 + t.header.stamp.nanosec
        assert bytes(live[s].data) == t.data.tobytes(), f"frame {s}: live tensor differs from offline replay"
        assert live[s].source_encoding == t.source_encoding == payload.format


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


def test_clock_publishes_the_bag_time_for_a_sim_time_node(tmp_path: Path) -> None:
    """`play --clock` publishes /clock with the bag's time, as `ros2 bag play --clock`
    does: ticks between the frames and the frame's own time at each frame, never going
    back within a pass. A node with use_sim_time runs on it: each FrameTiming.age_us is
    the bag time the node had reached minus the frame's stamp, so within one frame period
    (on the wall clock it would be years)."""
    from rclpy.qos import qos_profile_sensor_data
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image

    period_ns = 200_000_000
    frames = [photo_frame("bgr8", "chelsea.png", size=(96, 64)) for _ in range(8)]
    stamps = write_bag(tmp_path / "in", frames, storage="mcap", period_ns=period_ns, with_camera_info=False)
    ns = "/simclock"
    with NodeProcess(["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "use_sim_time:=true",
                      "-p", "network_image_width:=64", "-p", "network_image_height:=64"],
                     log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        clock: list[int] = []
        peer.node.create_subscription(Clock, "/clock",
                                      lambda m: clock.append(m.clock.sec * 10**9 + m.clock.nanosec), 10)
        try:
            peer.wait_connected()
            # The player waits for image subscribers: the node and this peer (its /clock
            # reader, made before, is announced with its image reader; the player's first
            # /clock messages may still go out before it matched, so the checks below are
            # on the last frames).
            peer.node.create_subscription(Image, f"{ns}/image", lambda m: None, qos_profile_sensor_data)
            play = subprocess.Popen([str(CLI), "play", str(tmp_path / "in"), "--image-topic", f"{ns}/image",
                                     "--wait-subscribers", "2", "--clock", "20"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            peer.spin_until(lambda: play.poll() is not None, 30, "play to finish")
            out = play.stdout.read() if play.stdout else ""
            assert play.returncode == 0, out
            peer.spin_until(lambda: {stamp_ns(t.header) for t in peer.tensors} >= set(stamps), 10,
                            "a tensor for every frame")
            ages = {s: peer.timing_for(s).age_us for s in stamps}
        finally:
            peer.close()
        assert node.stop() == 0
    # Bag time only (log times: stamp + 1 ns), non-decreasing, ticking between frames:
    # 7 gaps of 0.2 s at 20 Hz give ~28 ticks besides the 8 frames' own; this reader
    # may have matched after the first ones, so the checks are on the last frames.
    assert clock and min(clock) >= stamps[0] and max(clock) <= stamps[-1] + 1, clock
    assert all(a <= b for a, b in zip(clock, clock[1:])), clock
    assert {s + 1 for s in stamps[-3:]} <= set(clock), "no tick at a frame's own time"
    between = [c for c in clock if stamps[-3] + 1 < c < stamps[-1] + 1 and c - 1 not in stamps]
    assert len(between) >= 4, (between, clock)
    for s, age in ages.items():
        assert 0.0 <= age < period_ns / 1000, f"frame {s}: age_us {age} is not on the bag's clock"


def test_clock_and_restamp_are_refused_together(tmp_path: Path) -> None:
    p = subprocess.run([str(CLI), "play", str(tmp_path / "none"), "--clock", "--restamp"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "--restamp" in p.stderr and "--clock" in p.stderr, p.stderr


def test_sigint_stops_play_as_its_end(tmp_path: Path) -> None:
    """Ctrl-C (as `ros2 launch` sends it at shutdown) ends a looping play with its summary
    and exit 0, not killed by the signal. The signal is sent once a subscriber has seen
    the bag looped (more images than it holds), not after a fixed sleep: a loaded machine
    may take over a second to start the player."""
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    frames = [photo_frame("rgb8", "chelsea.png", size=(64, 48)) for _ in range(5)]
    write_bag(tmp_path / "in", frames, storage="mcap", period_ns=33_333_333, with_camera_info=False)
    ns = "/sigint_test"
    peer = Peer(ns, publish_images=False)
    seen: list[int] = []
    peer.node.create_subscription(Image, f"{ns}/image", lambda m: seen.append(stamp_ns(m.header)),
                                  qos_profile_sensor_data)
    try:
        p = subprocess.Popen([str(CLI), "play", str(tmp_path / "in"), "--loop", "--image-topic", f"{ns}/image",
                              "--wait-subscribers", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            peer.spin_until(lambda: len(seen) > 2 * len(frames), 30, "the looped bag's images")
        finally:
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=10)
    finally:
        peer.close()
    assert p.returncode == 0, (p.returncode, err)
    n = int(out.split("play: ")[1].split(" images")[0])
    assert n >= len(seen) > 2 * len(frames), (out, len(seen))
