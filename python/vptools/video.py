"""Video streams for the tests of video inputs (docs/VIDEO.md), made at test time.

Frames: a window panned across a photograph of test/data (real content that moves).
Encoder: GStreamer's x264enc (gstreamer1.0-plugins-ugly) or x265enc (-plugins-bad) run by
gst-launch-1.0 into an MPEG-TS file, which PyAV's demuxer splits into access units with
their PTS and key-frame flags (Annex B, as foxglove_msgs/CompressedVideo,
FFMPEGPacket and Isaac ROS's CompressedImage carry them). Oracle: PyAV's decoder (FFmpeg's
libavcodec, an independent build from the node's gstreamer1.0-libav), whose frames are
NV12 like the node's (4:2:0 planes interleaved: no conversion); H.264/H.265 decoding is
bit-exact by specification, so the node's frames must equal these exactly.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import av
import cv2
import numpy as np

from vptools.compressed import photo

#: A stream's first presentation stamp (ns since the epoch).
BASE_STAMP = 1_700_000_000_000_000_000
#: MPEG-TS timestamps tick at 90 kHz.
TS_HZ = 90_000

#: gst-launch-1.0's encoder per codec: (element and options, parser, PyAV decoder name).
ENCODERS = {
    "h264": ("x264enc speed-preset=veryfast tune=fastdecode b-adapt=false bframes={bframes} key-int-max={gop}",
             "h264parse", "h264"),
    "h265": ("x265enc speed-preset=ultrafast key-int-max={gop} option-string=bframes={bframes}",
             "h265parse", "hevc"),
}


@dataclass
class Packet:
    """One access unit, in decode order."""
    data: bytes
    #: Presentation stamp (ns since the epoch) of the frame it carries.
    stamp: int
    #: The encoder's frame number of that frame (FFMPEGPacket's pts).
    pts: int
    key: bool


@dataclass
class Frame:
    """One decoded frame, in presentation order."""
    stamp: int
    width: int
    height: int
    nv12: bytes


def pan_frames(name: str, width: int, height: int, count: int, step: tuple[int, int] = (5, 3)) -> list[np.ndarray]:
    """`count` BGR frames of `width` x `height`: a window moving `step` pixels a frame
    across the photograph `name` (scaled up first when it is smaller than the path)."""
    img = photo(name)
    need_w, need_h = width + step[0] * count, height + step[1] * count
    scale = max(need_w / img.shape[1], need_h / img.shape[0], 1.0)
    if scale > 1.0:
        img = cv2.resize(img, (int(img.shape[1] * scale) + 1, int(img.shape[0] * scale) + 1))
    return [np.ascontiguousarray(img[i * step[1]:i * step[1] + height, i * step[0]:i * step[0] + width])
            for i in range(count)]


def encode(frames: list[np.ndarray], codec: str, tmp: Path, *, bframes: int = 0, gop: int = 8,
           fps: int = 30) -> list[Packet]:
    """The frames encoded by GStreamer's encoder for `codec`, as access units in decode
    order with their presentation stamps (BASE_STAMP + frame number / fps)."""
    h, w = frames[0].shape[:2]
    tag = f"{codec}_{w}x{h}_{len(frames)}_{bframes}_{gop}"
    raw, ts = tmp / f"{tag}.i420", tmp / f"{tag}.ts"
    raw.write_bytes(b"".join(cv2.cvtColor(f, cv2.COLOR_BGR2YUV_I420).tobytes() for f in frames))
    enc, parse, _ = ENCODERS[codec]
    line = (f"filesrc location={raw} ! rawvideoparse width={w} height={h} format=i420 framerate={fps}/1 ! "
            f"{enc.format(bframes=bframes, gop=gop)} ! {parse} ! mpegtsmux ! filesink location={ts}")
    r = subprocess.run(["gst-launch-1.0", "-q", *line.split()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"gst-launch-1.0 {line}: {r.stderr[-2000:]}"
    with av.open(str(ts)) as container:
        packets = [p for p in container.demux(video=0) if p.size]
        first = min(p.pts for p in packets)
        out = []
        for p in packets:
            n = round((p.pts - first) * fps / TS_HZ)
            out.append(Packet(bytes(p), BASE_STAMP + n * 1_000_000_000 // fps, n, bool(p.is_keyframe)))
    assert len(out) == len(frames), f"{len(out)} packets for {len(frames)} frames"
    return out


def decode(packets: list[Packet], codec: str) -> list[Frame]:
    """PyAV's frames of the packets (fed in order, with their stamps as PTS), in
    presentation order, as NV12."""
    ctx = av.CodecContext.create(ENCODERS[codec][2], "r")
    frames: list[Frame] = []

    def take(decoded) -> None:
        for f in decoded:
            planes = f.to_ndarray()  # yuv420p: (h * 3 / 2, w): Y, then U, then V
            h, w = f.height, f.width
            y, u, v = planes[:h], planes[h:h + h // 4].reshape(h // 2, w // 2), planes[h + h // 4:].reshape(h // 2, w // 2)
            uv = np.stack([u, v], axis=-1).reshape(h // 2, w)
            frames.append(Frame(int(f.pts), w, h, y.tobytes() + uv.tobytes()))

    for p in packets:
        pkt = av.Packet(p.data)
        pkt.pts = p.stamp
        take(ctx.decode(pkt))
    take(ctx.decode(None))
    return frames


#: Our copies of the video messages (msgs/): rosbags registers them from the .msg files.
VIDEO_MSGS = {"foxglove": ("foxglove_msgs/msg/CompressedVideo", "foxglove_msgs"),
              "ffmpeg": ("ffmpeg_image_transport_msgs/msg/FFMPEGPacket", "ffmpeg_image_transport_msgs")}
FFMPEG_ENCODING = {"h264": "h264;yuv420p;bgr8;bgr8", "h265": "hevc;yuv420p;bgr8;bgr8"}


def write_video_bag(path: Path, kind: str, codec: str, packets: list[Packet], topic: str = "/camera/image_raw",
                    frame_id: str = "video_camera") -> str:
    """The packets as a rosbag2 (MCAP) written by rosbags, in decode order, each received
    1 ms after the previous one's stamp order: `kind` foxglove (CompressedVideo on
    `<topic>/foxglove`), ffmpeg (FFMPEGPacket on `<topic>/ffmpeg`) or compressed
    (CompressedImage, format `codec`, on `<topic>/compressed`). Returns the bag's topic."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import get_types_from_msg

    from vptools import ROOT
    from vptools.bags import TS, CompressedImage, Time, header

    if kind in VIDEO_MSGS:
        msgtype, package = VIDEO_MSGS[kind]
        if msgtype not in TS.types:
            name = msgtype.rsplit("/", 1)[1]
            TS.register(get_types_from_msg((ROOT / "msgs" / package / "msg" / f"{name}.msg").read_text(), msgtype))
    else:
        msgtype = CompressedImage.__msgtype__
    cls = TS.types[msgtype]
    bag_topic = f"{topic}/{kind}"
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection(bag_topic, msgtype, typestore=TS)
        for i, p in enumerate(packets):
            data = np.frombuffer(p.data, np.uint8)
            if kind == "foxglove":
                msg = cls(timestamp=Time(sec=p.stamp // 10**9, nanosec=p.stamp % 10**9), frame_id=frame_id,
                          data=data, format=codec)
            elif kind == "ffmpeg":
                msg = cls(header=header(p.stamp, frame_id), width=0, height=0, encoding=FFMPEG_ENCODING[codec],
                          pts=p.pts, flags=int(p.key), is_bigendian=False, data=data)
            else:
                msg = cls(header=header(p.stamp, frame_id), format=codec, data=data)
            w.write(conn, packets[0].stamp + i * 33_333_333, TS.serialize_cdr(msg, msgtype))
    return bag_topic
