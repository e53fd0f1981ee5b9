"""rosbag2 bags written and read with the `rosbags` library (pure Python, independent of
vision_preproc): inputs for `replay`/`play` (`sensor_msgs/Image` from raw frames,
`sensor_msgs/CompressedImage` from payloads), and the reader of their output bags."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from vptools import ROOT
from vptools.compressed import Payload
from vptools.sources import Frame
from vptools.tolerances import tensor_array  # noqa: F401 (callers import it from here)

MSGS = ROOT / "msgs" / "vision_preproc_msgs" / "msg"


def typestore():
    """The installed distribution's types (ROS_DISTRO; rosbags' latest without one) plus
    vision_preproc_msgs, read from our .msg files."""
    distro = os.environ.get("ROS_DISTRO", "")
    ts = get_typestore(getattr(Stores, f"ROS2_{distro.upper()}", Stores.LATEST))
    add = {}
    for name in ("Tensor", "FrameTiming", "BatchItem", "TensorBatch"):
        add.update(get_types_from_msg((MSGS / f"{name}.msg").read_text(), f"vision_preproc_msgs/msg/{name}"))
    ts.register(add)
    return ts


TS = typestore()
Image = TS.types["sensor_msgs/msg/Image"]
CompressedImage = TS.types["sensor_msgs/msg/CompressedImage"]
CameraInfo = TS.types["sensor_msgs/msg/CameraInfo"]
Header = TS.types["std_msgs/msg/Header"]
Time = TS.types["builtin_interfaces/msg/Time"]
RegionOfInterest = TS.types["sensor_msgs/msg/RegionOfInterest"]


def header(stamp_ns: int, frame_id: str = "camera"):
    return Header(stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=frame_id)


def image_of(frame: Frame, stamp_ns: int, frame_id: str = "camera"):
    return Image(header=header(stamp_ns, frame_id), height=frame.height, width=frame.width,
                 encoding=frame.encoding, is_bigendian=int(frame.big_endian), step=frame.step,
                 data=np.frombuffer(frame.data, np.uint8))


def compressed_of(payload: Payload, stamp_ns: int, frame_id: str = "camera"):
    return CompressedImage(header=header(stamp_ns, frame_id), format=payload.format,
                           data=np.frombuffer(payload.data, np.uint8))


def message_of(item: Frame | Payload, stamp_ns: int, frame_id: str = "camera") -> tuple[str, bytes]:
    """(type, CDR) of a raw frame (sensor_msgs/Image) or a payload (CompressedImage)."""
    if isinstance(item, Payload):
        return CompressedImage.__msgtype__, TS.serialize_cdr(compressed_of(item, stamp_ns, frame_id),
                                                             CompressedImage.__msgtype__)
    return Image.__msgtype__, TS.serialize_cdr(image_of(item, stamp_ns, frame_id), Image.__msgtype__)


def size_of(item: Frame | Payload) -> tuple[int, int]:
    """(width, height); a payload's from OpenCV's decode ((0, 0) when it does not decode)."""
    if not isinstance(item, Payload):
        return item.width, item.height
    import cv2

    img = cv2.imdecode(np.frombuffer(item.data, np.uint8), cv2.IMREAD_UNCHANGED)
    return (0, 0) if img is None else (img.shape[1], img.shape[0])


def camera_info_topic(image_topic: str) -> str:
    """`camera_info` beside an image topic (`/cam/image_raw[/compressed]` -> `/cam/camera_info`)."""
    base = image_topic.removesuffix("/compressed")
    return base.rsplit("/", 1)[0] + "/camera_info"


def camera_info(width: int, height: int, stamp_ns: int):
    k = np.array([500.0, 0, width / 2, 0, 500.0, height / 2, 0, 0, 1])
    p = np.array([500.0, 0, width / 2, 0, 0, 500.0, height / 2, 0, 0, 0, 1, 0])
    return CameraInfo(header=header(stamp_ns), height=height, width=width, distortion_model="plumb_bob",
                      d=np.zeros(5), k=k, r=np.eye(3).ravel(), p=p, binning_x=0, binning_y=0,
                      roi=RegionOfInterest(x_offset=0, y_offset=0, height=0, width=0, do_rectify=False))


def write_bag(path: Path, frames: list[Frame] | list[Payload], storage: str = "mcap",
              topic: str = "/camera/image_raw", period_ns: int = 33_333_333, with_camera_info: bool = True,
              start_ns: int = 1_700_000_000_000_000_000,
              extra: list[tuple[str, str, bytes]] | None = None) -> list[int]:
    """Write `frames` as sensor_msgs/Image on `topic` (payloads: as
    sensor_msgs/CompressedImage; `topic` is then e.g. `/camera/image_raw/compressed`), and
    a camera_info before each, in `storage` ("mcap" or "sqlite3"). `extra`: (topic, type,
    raw CDR) messages appended after the images. Returns the stamps."""
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    types = {message_of(f, 0)[0] for f in frames[:1]}
    msgtype = types.pop() if types else Image.__msgtype__
    stamps = []
    with Writer(path, version=9, storage_plugin=plugin) as w:
        img_c = w.add_connection(topic, msgtype, typestore=TS)
        info_c = w.add_connection(camera_info_topic(topic), CameraInfo.__msgtype__, typestore=TS)
        extra_c = {(topic, msgtype): img_c}
        for i, f in enumerate(frames):
            t = start_ns + i * period_ns
            stamps.append(t)
            if with_camera_info:
                w.write(info_c, t, TS.serialize_cdr(camera_info(*size_of(f), t), CameraInfo.__msgtype__))
            ty, cdr = message_of(f, t)
            assert ty == msgtype, f"frame {i}: a {ty} among {msgtype} messages"
            w.write(img_c, t + 1, cdr)
        for j, (tp, ty, raw) in enumerate(extra or []):
            if (tp, ty) not in extra_c:
                extra_c[(tp, ty)] = w.add_connection(tp, ty, typestore=TS)
            w.write(extra_c[(tp, ty)], start_ns + (len(frames) + j) * period_ns, raw)
    return stamps


def write_cameras(path: Path, cams: list[tuple[str, Frame | Payload, list[int]]], storage: str = "mcap") -> None:
    """Several image topics in one bag: (topic, frame or payload, stamps); each message
    received 1 ms after its stamp, all in receive-time order."""
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    msgs = sorted((t + 1_000_000, topic, t) for topic, _, stamps in cams for t in stamps)
    items = {topic: f for topic, f, _ in cams}
    with Writer(path, version=9, storage_plugin=plugin) as w:
        conns = {topic: w.add_connection(topic, message_of(f, 0)[0], typestore=TS) for topic, f, _ in cams}
        for recv, topic, t in msgs:
            w.write(conns[topic], recv, message_of(items[topic], t, topic)[1])


def read_outputs(path: Path) -> tuple[list, list]:
    """(tensors, timings) of an output bag, deserialized by rosbags."""
    tensors, timings = [], []
    with Reader(path) as r:
        for conn, _t, raw in r.messages():
            msg = TS.deserialize_cdr(raw, conn.msgtype)
            (tensors if conn.msgtype.endswith(("/Tensor", "/TensorBatch")) else timings).append(msg)
    return tensors, timings

