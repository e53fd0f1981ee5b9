"""Video inputs through real DDS (docs/VIDEO.md): an rclpy camera publishes H.264/H.265
packets as foxglove_msgs/CompressedVideo (`image/foxglove`), ffmpeg_image_transport_msgs/
FFMPEGPacket (`image/ffmpeg`) and sensor_msgs/CompressedImage with format h264
(`image/compressed`, Isaac ROS's encoder) to the node, which decodes them with the CPU
decoder (gstreamer1.0-libav) inside its own process.

Bags of each kind (written by rosbags) are played into the node by `vision_preproc play`.

Streams are made at test time (python/vptools/video.py): a window panned across a
photograph of test/data, encoded by GStreamer's x264enc / x265enc, split into access units
by PyAV; the oracle is PyAV's own decoder. At the source size, stretch, pixel_scale 1 and
no normalization (IDENTITY), a decoded sample one level off moves the tensor by 0.39 or
more, 3900 times the float32 tolerance: the tensors' agreement within that tolerance is
the decoded frames' equality (outside the colour conversion's clamping).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from ffmpeg_image_transport_msgs.msg import FFMPEGPacket
from foxglove_msgs.msg import CompressedVideo
from sensor_msgs.msg import CompressedImage

from vptools import oracle
from vptools.bags import read_outputs
from vptools.rosharness import NODE_BIN, NodeProcess, Peer, stamp_ns, tensor_array
from vptools.rosharness import frame_counts as counts
from vptools.rosharness import status_values as kv
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from vptools.tolerances import assert_close
from vptools.video import FFMPEG_ENCODING, Frame, Packet, decode, encode, pan_frames, write_video_bag

IDENTITY = {"network_image_width": 320, "network_image_height": 240, "resize_mode": "stretch",
            "pixel_scale": 1.0, "image_mean": [0.0, 0.0, 0.0], "image_stddev": [1.0, 1.0, 1.0]}
SMALL = {"network_image_width": 96, "network_image_height": 64, "resize_mode": "letterbox"}
#: Reliable and deep enough for a whole test stream: no packet lost on the way (a gap is
#: made by not sending one).
DEEP = QoSProfile(reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST, depth=100)
KINDS = {"foxglove": (CompressedVideo, "foxglove"), "ffmpeg": (FFMPEGPacket, "ffmpeg"),
         "compressed": (CompressedImage, "compressed")}
CLI = NODE_BIN.parent / "vision_preproc"


def message(kind: str, codec: str, p: Packet, frame_id: str = "video_camera"):
    """The packet as a message of `kind`."""
    sec, nsec = p.stamp // 10**9, p.stamp % 10**9
    if kind == "foxglove":
        m = CompressedVideo(frame_id=frame_id, format=codec)
        m.timestamp.sec, m.timestamp.nanosec = sec, nsec
    else:
        m = FFMPEGPacket(encoding=FFMPEG_ENCODING[codec], pts=p.pts, flags=int(p.key)) if kind == "ffmpeg" \
            else CompressedImage(format=codec)
        m.header.stamp.sec, m.header.stamp.nanosec, m.header.frame_id = sec, nsec, frame_id
    m.data = p.data
    return m


def restamped(packets: list[Packet], offset_ns: int) -> list[Packet]:
    return [Packet(p.data, p.stamp + offset_ns, p.pts, p.key) for p in packets]


def oracle_of(frames: list[Frame], offset_ns: int = 0) -> dict[int, Frame]:
    return {f.stamp + offset_ns: f for f in frames}


class VideoCamera:
    """The rclpy camera of one or more video topics, with the node's tensors and status."""

    def __init__(self, ns: str, kind: str, topics: list[str], batch: bool = False) -> None:
        self.peer = Peer(ns, publish_images=False, batch=batch)
        self.kind = kind
        msg_type, suffix = KINDS[kind]
        self.pubs = [self.peer.node.create_publisher(msg_type, f"{t}/{suffix}", DEEP) for t in topics]
        self.statuses = []
        name = f"{ns.strip('/')}/vision_preproc"
        self.peer.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: self.statuses.extend(s for s in m.status if s.name == name), DEEP)
        self.peer.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in self.pubs)
                             and self.peer.node.count_publishers(f"{ns}/tensor") >= 1, 20.0,
                             "the node's video subscriptions and its tensor")

    def send(self, codec: str, packets: list[Packet], pub: int = 0) -> None:
        """Publish the packets in decode order, a spin between them (the camera's pace)."""
        for p in packets:
            self.pubs[pub].publish(message(self.kind, codec, p))
            self.peer.executor.spin_once(timeout_sec=0.03)

    def status_when(self, cond, what: str, timeout: float = 15.0):
        """The first /diagnostics status (from now) for which `cond(values)` holds."""
        n = len(self.statuses)
        try:
            self.peer.spin_until(lambda: any(cond(kv(s)) for s in self.statuses[n:]), timeout, what)
        except AssertionError as e:
            last = kv(self.statuses[-1]) if self.statuses else "no status"
            raise AssertionError(f"{e}; the last status: {last}") from None
        return next(s for s in self.statuses[n:] if cond(kv(s)))

    def settled(self, frames_out: int, timeout: float = 20.0):
        """The status once at least `frames_out` frames came out of the decoder, every frame
        received is published or dropped, and this peer has every published tensor."""
        def done(v: dict) -> bool:
            c = {k: int(x) for k, x in v.items() if k.startswith("Frames")}
            return int(v.get("Input video frames", "0 out").split()[0]) >= frames_out \
                and c["Frames received"] == c["Frames published"] + c["Frames dropped (queue)"] \
                + c["Frames rejected (invalid)"] + c["Frames failed (error)"] \
                and c["Frames published"] <= len(self.peer.tensors)
        return self.status_when(done, f"{frames_out} frames decoded and accounted for", timeout)


def check_tensors(tensors, want: dict[int, Frame], config: dict, what: str) -> list[int]:
    """Every tensor equal to the oracle of its stamp's frame; the stamps in presentation
    order. Returns the stamps."""
    stamps = [stamp_ns(t.header) for t in tensors]
    assert stamps == sorted(stamps), f"{what}: stamps out of presentation order"
    for t, s in zip(tensors, stamps):
        assert s in want, f"{what}: a tensor stamped {s}, no frame of the stream has it"
        f = want[s]
        assert (t.source_width, t.source_height) == (f.width, f.height), what
        assert t.header.frame_id == "video_camera", what
        expect = oracle.preprocess(f.nv12, "nv12", f.width, f.height, f.width, False, config)
        assert_close(tensor_array(t), expect, "float32", f"{what}: frame {s}")
    return stamps


def node_args(ns: str, transport: str, config: dict, *extra: str) -> list[str]:
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", f"image_transport:={transport}",
            "-p", "input_qos:=default", "-p", "input_qos_depth:=100", *extra]
    return args + [a for k, v in config.items() for a in ("-p", f"{k}:={v}".replace(" ", ""))]


def test_foxglove_h264_with_b_frames_joined_mid_stream_equals_pyav(tmp_path) -> None:
    """24 frames, B-frames, a key frame every 8; the camera is joined at its third packet:
    the 6 packets before the next key frame are counted waiting, the 16 frames from it are
    decoded, each tensor (stamped with its frame's presentation stamp, in presentation order)
    equal to PyAV's frame. (The stream's first GOP is sent again after it, 10 s later, so
    that the decoder's reorder delay lets the last frames out.)"""
    packets = encode(pan_frames("chelsea.png", 320, 240, 24), "h264", tmp_path, bframes=2, gop=8)
    assert [p.pts for p in packets[:4]] == [0, 3, 1, 2], "the encoder made no B-frames"
    frames = decode(packets, "h264")
    want = {**oracle_of(frames), **oracle_of(frames, 10 * 10**9)}
    ns = "/video_fox"
    with NodeProcess(node_args(ns, "foxglove", IDENTITY), log=tmp_path / "node.log") as node:
        cam = VideoCamera(ns, "foxglove", ["image"])
        try:
            cam.send("h264", packets[2:] + restamped(packets[:8], 10 * 10**9))
            status = cam.settled(16 + 6)
            v, c = kv(status), counts(status)
            assert v["Input video packets"] == "30 received: 24 decoded, 6 waiting for a key frame, 0 refused", v
            assert v["Input video decoder"].startswith("h264 320x240: avdec_h264"), v
            assert v["Input transport"].startswith("foxglove"), v
            assert v["Input topic"] == f"{ns}/image/foxglove", v
            stamps = check_tensors(cam.peer.tensors, want, IDENTITY, "foxglove h264")
            assert c["Frames published"] == len(stamps) >= 8, c
            assert min(stamps) == packets[8].stamp, "the first frame is the key frame's"
            first = [s for s in stamps if s < packets[0].stamp + 10 * 10**9]
            assert c["Frames dropped (queue)"] > 0 or first == [f.stamp for f in frames[8:]], first
        finally:
            cam.peer.close()
        assert node.stop() == 0, node.output()[-3000:]
    log = (tmp_path / "node.log").read_text()
    assert "h264 320x240 stream from a key frame: decoder avdec_h264" in log, log[-2000:]


def test_ffmpeg_h265_lost_packet_resyncs_and_a_restarted_publisher_resumes(tmp_path) -> None:
    """FFMPEGPacket (pts consecutive: no B-frames): packet 3 is never sent; the gap is
    counted and packets 4-7 wait for the key frame 8. Then the publisher starts again from
    pts 0 (new stamps): decoded again from its first key frame."""
    packets = encode(pan_frames("astronaut.png", 320, 240, 24), "h265", tmp_path, bframes=0, gop=8)
    frames = decode(packets, "h265")
    again = restamped(packets, 10 * 10**9)
    want = {**oracle_of(frames), **oracle_of(frames, 10 * 10**9)}
    ns = "/video_ffmpeg"
    with NodeProcess(node_args(ns, "ffmpeg", IDENTITY), log=tmp_path / "node.log") as node:
        cam = VideoCamera(ns, "ffmpeg", ["image"])
        try:
            cam.send("h265", packets[:3] + packets[4:])
            status = cam.settled(3 + 16)
            v = kv(status)
            assert v["Input video packets"] == "23 received: 19 decoded, 4 waiting for a key frame, 0 refused", v
            assert "1 gaps (lost packets)" in v["Input video frames"], v
            assert "lost before the node (pts jumped from 2 to 4)" in v["Input video last problem"], v
            cam.send("h265", again)
            status = cam.settled(19 + 24)
            stamps = check_tensors(cam.peer.tensors, want, IDENTITY, "ffmpeg h265")
            assert packets[3].stamp not in stamps and packets[4].stamp not in stamps
            assert again[-1].stamp in stamps or counts(status)["Frames dropped (queue)"] > 0
        finally:
            cam.peer.close()
        assert node.stop() == 0, node.output()[-3000:]


def bad_packets(good_key: Packet, h265_key: Packet) -> list[tuple[str, bytes]]:
    """(expected refusal, payload) of damaged and lying packets sent as h264."""
    rng = np.random.default_rng(45)
    sps_16k = bytes.fromhex("6742c03eda003c000439b016a0202028000003000800000301e478402150")
    return [
        ("not Annex B", bytes([0xde, 0xad]) + rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()),
        ("not the named codec", h265_key.data),
        ("truncated", good_key.data[:12]),
        ("over the size limits", b"\0\0\0\1" + sps_16k + b"\0\0\0\1\x68\xce\x38\x80\0\0\0\1\x65\x88\x84\x00"),
        ("empty", b""),
    ]


def test_compressed_h264_resolution_change_and_bad_packets(tmp_path) -> None:
    """sensor_msgs/CompressedImage with format h264: a 320x240 stream, then a 256x192 one
    (the decoder renegotiates; the node keeps running), each bad packet (garbage, H.265
    bytes labelled h264, a key frame cut inside its SPS, a 16K stream's SPS, an empty one)
    refused by its cause, and the stream decoded again from its next key frame; then the
    codec changes to H.265 on the same topic (a new decode pipeline)."""
    a = encode(pan_frames("rocket.jpg", 320, 240, 12), "h264", tmp_path, gop=6)
    b = encode(pan_frames("coffee.png", 256, 192, 12), "h264", tmp_path, gop=6)
    h265 = encode(pan_frames("coffee.png", 256, 192, 2), "h265", tmp_path, gop=2)
    fa, fb, fc = decode(a, "h264"), decode(b, "h264"), decode(h265, "h265")
    step = 20 * 10**9
    want = {**oracle_of(fa), **oracle_of(fb, step), **oracle_of(fb, 2 * step), **oracle_of(fc, 3 * step)}
    ns = "/video_compressed"
    with NodeProcess(node_args(ns, "compressed", SMALL), log=tmp_path / "node.log") as node:
        cam = VideoCamera(ns, "compressed", ["image"])
        try:
            cam.send("h264", a[:6])
            refused = 0
            for cause, payload in bad_packets(b[0], h265[0]):
                cam.pubs[0].publish(message("compressed", "h264", Packet(payload, a[5].stamp + 1, 0, False)))
                refused += 1
                cam.status_when(lambda v, c=cause: f"{c} 1" in v.get("Input video packets", ""),
                                f"the refusal '{cause}' counted")
            cam.send("h264", [a[7]])  # no key frame: waits
            cam.send("h264", a[6:] + restamped(b, step) + restamped(b, 2 * step))
            cam.send("h265", restamped(h265, 3 * step))  # a codec change: a new pipeline
            status = cam.settled(12 + 24 + 2)
            v = kv(status)
            assert v["Input video packets"].startswith(
                f"{6 + refused + 1 + 6 + 24 + 2} received: 38 decoded, 1 waiting for a key frame, {refused} refused"), v
            assert "2 decoder starts" in v["Input video frames"], v
            assert v["Input video decoder"].startswith("h265 256x192: avdec_h265"), v
            stamps = check_tensors(cam.peer.tensors, want, SMALL, "compressed h264")
            sizes = {(t.source_width, t.source_height) for t in cam.peer.tensors}
            assert sizes == {(320, 240), (256, 192)}, sizes
            assert len(stamps) >= 18, len(stamps)
            assert node.proc.poll() is None
        finally:
            cam.peer.close()
        assert node.stop() == 0, node.output()[-3000:]
    log = (tmp_path / "node.log").read_text()
    assert "video packet refused" in log and "panicked" not in log, log[-3000:]


def test_four_video_inputs_batched(tmp_path) -> None:
    """Four foxglove inputs in one node (approximate_time on equal stamps): a TensorBatch of
    all four, each item equal to PyAV's frame of its own stream."""
    topics = ["front", "rear", "left", "right"]
    photos = ["chelsea.png", "astronaut.png", "rocket.jpg", "coffee.png"]
    streams = [encode(pan_frames(p, 160, 120, 8), "h264", tmp_path, gop=4) for p in photos]
    wants = [oracle_of(decode(s, "h264")) for s in streams]
    ns = "/video_batch"
    inputs = "[" + ", ".join(f'"{t}/image"' for t in topics) + "]"
    args = node_args(ns, "foxglove", SMALL, "-p", f"inputs:={inputs}", "-p", "batch_policy:=approximate_time")
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        cam = VideoCamera(ns, "foxglove", [f"{t}/image" for t in topics], batch=True)
        try:
            for k in range(8):
                for i, s in enumerate(streams):
                    cam.pubs[i].publish(message("foxglove", "h264", s[k]))
                cam.peer.executor.spin_once(timeout_sec=0.02)
            cam.peer.spin_until(lambda: any(all(it.valid for it in b.items) for b in cam.peer.tensors), 15.0,
                                "a batch of all four cameras")
            full = [b for b in cam.peer.tensors if all(it.valid for it in b.items)]
            whole = tensor_array(full[-1])
            for i, item in enumerate(full[-1].items):
                f = wants[i][stamp_ns(item.header)]
                assert_close(whole[i:i + 1], oracle.preprocess(f.nv12, "nv12", f.width, f.height, f.width, False,
                                                               SMALL), "float32", f"item {i} ({topics[i]})")
        finally:
            cam.peer.close()
        assert node.stop() == 0, node.output()[-3000:]


def test_bags_of_each_kind_played_into_the_node(tmp_path) -> None:
    """A bag of each kind (rosbags; foxglove, ffmpeg, compressed h264) played by
    `vision_preproc play` into a node of that transport: every tensor equal to PyAV's
    frame of its stamp, from the bag's first key frame on."""
    packets = encode(pan_frames("chelsea.png", 160, 120, 8), "h264", tmp_path, gop=4)
    want = oracle_of(decode(packets, "h264"))
    for kind in KINDS:
        ns = f"/video_bag_{kind}"
        bag_topic = write_video_bag(tmp_path / kind, kind, "h264", packets)
        with NodeProcess(node_args(ns, kind, SMALL), log=tmp_path / f"{kind}.log") as node:
            cam = VideoCamera(ns, kind, [])
            try:
                play = subprocess.run([str(CLI), "play", str(tmp_path / kind), "--image-topic", f"{ns}/image",
                                       "--reliable", "--wait-subscribers", "1"],
                                      capture_output=True, text=True, timeout=60)
                assert play.returncode == 0, play.stderr
                assert f"play: {len(packets)} images" in play.stdout, play.stdout
                assert f"images on {ns}/image/{kind}" in play.stdout, (bag_topic, play.stdout)
                status = cam.settled(len(packets))
                assert kv(status)["Input video packets"].startswith(f"{len(packets)} received: {len(packets)} decoded")
                stamps = check_tensors(cam.peer.tensors, want, SMALL, f"{kind} bag")
                assert stamps and stamps[-1] == packets[-1].stamp, (kind, stamps)
            finally:
                cam.peer.close()
            assert node.stop() == 0, node.output()[-3000:]


def replay_bag(bag: Path, out: Path, config: dict, *extra: str) -> tuple[str, dict]:
    """`vision_preproc replay` of the bag on the CPU backend: (stdout, the --json summary)."""
    sets = [a for k, v in config.items() for a in ("--set", f"{k}={v}".replace(" ", ""))]
    summary = out.parent / f"{out.name}.json"
    r = subprocess.run([str(CLI), "replay", str(bag), "-o", str(out), "--backend", "cpu", "--json", str(summary),
                        *sets, *extra], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    return r.stdout, json.loads(summary.read_text())


def test_bags_of_each_kind_replayed(tmp_path) -> None:
    """A bag of each kind (rosbags: foxglove H.264 with B-frames and compressed H.264, each
    starting mid-stream; ffmpeg H.265 from its start, whose encoder sends its parameter
    sets only there) replayed by `vision_preproc replay` through the node's decode path:
    the packets before the first key frame counted waiting for one, then every tensor (one
    per frame from the key frame on, in presentation order, stamped with its frame's stamp)
    equal to PyAV's frame. With `video_decoder: jetson` (no nvv4l2decoder here) each key
    frame is refused by name, the other packets wait, and nothing is written."""
    streams = {"foxglove": ("h264", 2, 2), "ffmpeg": ("h265", 0, 0), "compressed": ("h264", 0, 3)}
    for kind, (codec, bframes, start) in streams.items():
        packets = encode(pan_frames("coffee.png", 160, 120, 12), codec, tmp_path, bframes=bframes, gop=4)
        assert [p.key for p in packets].count(True) == 3, [p.key for p in packets]
        frames = decode(packets, codec)
        bag_topic = write_video_bag(tmp_path / kind, kind, codec, packets[start:])
        first_key = next(i for i, p in enumerate(packets) if i >= start and p.key)
        n, waiting = len(packets) - start, first_key - start
        out, summary = replay_bag(tmp_path / kind, tmp_path / f"{kind}_out", SMALL)
        v = summary["video"][bag_topic]
        assert (v["packets"], v["decoded"], v["waiting"], v["refused"]) == (n, n - waiting, waiting, {}), v
        assert (v["frames"], v["starts"], v["faults"], v["decoder"]) == (n - waiting, 1, 0, f"avdec_{codec}"), v
        assert f"topic {bag_topic} ({kind})" in out and f"waiting for a key frame {waiting}," in out, out
        tensors, timings = read_outputs(tmp_path / f"{kind}_out")
        assert summary["published"] == len(tensors) == len(timings) == n - waiting, (summary, len(tensors))
        want = oracle_of([f for f in frames if f.stamp >= packets[first_key].stamp])
        assert check_tensors(tensors, want, SMALL, f"{kind} bag replayed") == sorted(want), kind
    out, summary = replay_bag(tmp_path / "foxglove", tmp_path / "jetson_out", SMALL, "--set", "video_decoder=jetson")
    v = summary["video"]["/camera/image_raw/foxglove"]
    assert (v["waiting"], v["refused"], summary["published"]) == (8, {"no decoder": 2}, 0), v
    assert "nvv4l2decoder" in v["last_problem"] and "refused 2 (no decoder 2)" in out, (v, out)
