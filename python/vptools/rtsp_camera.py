"""An RTSP camera on loopback for the tests (test/ros/test_rtsp.py): GStreamer's
rtsp-server serving `rtsp://127.0.0.1:<port>/cam`, H.264 encoded as it is served by
x264enc (zerolatency: no frame held back; a key frame every `--gop` frames) from raw I420
frames the test wrote (python/vptools/video.py's panned photograph), looped, at `--fps`.

Every media the server makes (one per client session) also writes the encoded stream it
sends, byte for byte as x264enc made it, to `<record>_<n>.h264` (Annex B, written as it
goes): the test decodes that file with PyAV for the exact oracle of the frames the client
decodes.

Run by the system's Python (`/usr/bin/python3`: Debian's python3-gi and
gir1.2-gst-rtsp-server-1.0, which the test venv's Python does not see); it imports
nothing of vptools. Prints `ready rtsp://...` once it listens; runs until killed.
"""

from __future__ import annotations

import argparse
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def launch_line(width: int, height: int, fps: int, gop: int) -> str:
    """The media's pipeline: frames in (appsrc `src`), x264enc, the RTP payloader `pay0`
    and, beside it, the same encoded stream to the filesink `record`."""
    caps = f"video/x-raw,format=I420,width={width},height={height},framerate={fps}/1"
    return (f"( appsrc name=src format=time caps={caps} "
            f"! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={gop} "
            "! video/x-h264,stream-format=byte-stream,alignment=au ! tee name=t "
            "! queue ! rtph264pay name=pay0 pt=96 config-interval=-1 "
            "t. ! queue ! filesink name=record buffer-mode=unbuffered sync=false )")


class Feeder:
    """Pushes the file's frames into one media's appsrc, looped, stamped at `fps`."""

    def __init__(self, frames: list[bytes], fps: int) -> None:
        self.frames, self.fps, self.count = frames, fps, 0

    def need_data(self, src, _length) -> None:
        data = self.frames[self.count % len(self.frames)]
        buf = Gst.Buffer.new_wrapped(data)
        buf.pts = Gst.util_uint64_scale(self.count, Gst.SECOND, self.fps)
        buf.duration = Gst.util_uint64_scale(1, Gst.SECOND, self.fps)
        self.count += 1
        src.emit("push-buffer", buf)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--frames", required=True, help="raw I420 frames, one after another")
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--height", type=int, required=True)
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--gop", type=int, default=15, help="frames from one key frame to the next")
    ap.add_argument("--record", required=True, help="path prefix of each media's encoded stream")
    args = ap.parse_args()
    Gst.init(None)
    size = args.width * args.height * 3 // 2
    raw = open(args.frames, "rb").read()
    frames = [raw[i:i + size] for i in range(0, len(raw) - size + 1, size)]
    media_count = [0]

    def configure(_factory, media) -> None:
        bin_ = media.get_element()
        bin_.get_by_name("record").set_property("location", f"{args.record}_{media_count[0]}.h264")
        media_count[0] += 1
        bin_.get_by_name("src").connect("need-data", Feeder(frames, args.fps).need_data)

    server = GstRtspServer.RTSPServer(address="127.0.0.1", service=str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch_line(args.width, args.height, args.fps, args.gop))
    factory.connect("media-configure", configure)
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 1
    print(f"ready rtsp://127.0.0.1:{args.port}/cam", flush=True)
    GLib.MainLoop().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
