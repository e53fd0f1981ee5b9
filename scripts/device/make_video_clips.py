#!/usr/bin/env python3
"""H.264 and H.265 clips for test/gpu_video.rs, made HERE (the build machine) and decoded
here by an independent decoder for the oracle:

- encoded by GStreamer's x264enc (gstreamer1.0-plugins-ugly) and x265enc (-bad) from a
  real photograph of test/data (chelsea.png, held still, then panned by videobox crops)
  and from moving test patterns, with B-frames and a short GOP, as Annex B byte streams;
- decoded by PyAV (FFmpeg's libavcodec, `pip install av`): each frame's NV12 (its Y plane,
  then U and V interleaved, `width` bytes a row, taken from PyAV's yuv420p planes without
  any conversion) hashed with SHA-256, in output (presentation) order.

H.264/H.265 decoding is bit-exact by specification, so the hardware decoder's NV12 must
have the same hashes (test/gpu_video.rs). Writes DIR/clips.json and the clips.

    python3 scripts/device/make_video_clips.py DIR   # a python3 with `av` and numpy
"""

import hashlib
import json
import pathlib
import subprocess
import sys

import av
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHOTO = ROOT / "test" / "data" / "chelsea.png"

# name, codec, width, height, frames, source: the part of the gst-launch line before the
# encoder (ends in raw video of that size).
CLIPS = [
    ("h264_720p_ball_caps", "h264", 1280, 720, 45,
     "videotestsrc pattern=ball motion=sweep num-buffers={n}"),
    ("h264_1080p_smpte", "h264", 1920, 1080, 30,
     "videotestsrc pattern=smpte horizontal-speed=8 num-buffers={n}"),
    ("h264_642x362_photo", "h264", 642, 362, 30,
     "filesrc location={photo} ! pngdec ! imagefreeze num-buffers={n} ! videoconvert "
     "! videoscale"),
    ("h265_1080p_photo", "h265", 1920, 1080, 30,
     "filesrc location={photo} ! pngdec ! imagefreeze num-buffers={n} ! videoconvert "
     "! videoscale"),
    ("h265_720p_snow", "h265", 1280, 720, 20,
     "videotestsrc pattern=snow num-buffers={n}"),
]

ENCODERS = {
    # B-frames (decode order differs from output order) and a key frame every 15.
    "h264": "x264enc speed-preset=fast bframes=2 key-int-max=15 bitrate=4000 "
            "! video/x-h264,profile=high,stream-format=byte-stream",
    "h265": "x265enc speed-preset=fast key-int-max=15 bitrate=4000 "
            "option-string=bframes=2 ! video/x-h265,stream-format=byte-stream",
}


def encode(out: pathlib.Path, codec: str, w: int, h: int, n: int, source: str) -> None:
    src = source.format(n=n, photo=PHOTO)
    line = (f"{src} ! videoconvert ! video/x-raw,format=I420,width={w},height={h},"
            f"framerate=30/1 ! {ENCODERS[codec]} ! filesink location={out}")
    subprocess.run(["gst-launch-1.0", "-q", *line.split()], check=True)


def nv12_hashes(path: pathlib.Path, w: int, h: int) -> list:
    """SHA-256 of each decoded frame's tight NV12, in output order (PyAV)."""
    hashes = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            if frame.format.name != "yuv420p" or (frame.width, frame.height) != (w, h):
                raise SystemExit(f"{path}: {frame.format.name} {frame.width}x{frame.height}")
            planes = []
            for p, (pw, ph) in zip(frame.planes, [(w, h), (w // 2, h // 2), (w // 2, h // 2)]):
                a = np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:ph, :pw]
                planes.append(a)
            uv = np.empty((h // 2, w), np.uint8)
            uv[:, 0::2], uv[:, 1::2] = planes[1], planes[2]
            hashes.append(hashlib.sha256(planes[0].tobytes() + uv.tobytes()).hexdigest())
    return hashes


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    clips = []
    for name, codec, w, h, n, source in CLIPS:
        f = out / f"{name}.{codec}"
        encode(f, codec, w, h, n, source)
        frames = nv12_hashes(f, w, h)
        if len(frames) != n:
            raise SystemExit(f"{name}: PyAV decoded {len(frames)} frames of {n}")
        clips.append({"name": name, "file": f.name, "codec": codec, "width": w, "height": h,
                      "frames": frames})
        print(f"{name}: {f.stat().st_size} bytes, {len(frames)} frames (PyAV {av.__version__})")
    (out / "clips.json").write_text(json.dumps(clips, indent=1) + "\n")


if __name__ == "__main__":
    main()
