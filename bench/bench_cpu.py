#!/usr/bin/env python3
"""CPU benchmark: vision_preproc's CPU backend against the OpenCV + NumPy equivalent, in
one run, on the same frames (real photographs scaled to the frame size).

Scenarios (the speed targets of the CPU backend):
  A  1920x1080 bgr8        -> 640x640 letterbox, NCHW float32
  B  1280x720  yuv422_yuy2 -> 640x480 stretch,   NCHW float32

vision_preproc: `vision_preproc bench-cpu --json` on the raw frame (each sample is one
whole `Pipeline::process`: decode, resize, pad, normalize, layout).
OpenCV + NumPy, as a user writes it (the "typical" column, the headline ratio):
  cvtColor -> resize (uint8, INTER_LINEAR) -> copyMakeBorder -> astype(float32) * scale
  - mean) / std -> transpose -> ascontiguousarray   (+ filter2D with --conv)
and the same with the resize in float32 (the "exact" column: what the specification
computes, so the same numbers as vision_preproc within tolerance).

Rounds alternate (ours, typical, exact) so that load from other processes on the machine
hits all of them; the table gives p50 and p99 over all frames and the spread of the
per-round p50s. Run from the repository root after `cargo build --release`:

    python3 bench/bench_cpu.py [--rounds 5] [--frames 200] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(os.environ.get("VISION_PREPROC_CLI", ROOT / "target" / "release" / "vision_preproc"))
PHOTO = ROOT / "test" / "data" / "rocket.jpg"

MEAN = np.array([0.5, 0.5, 0.5], np.float32)
STD = np.array([0.5, 0.5, 0.5], np.float32)


def scenarios() -> list[dict]:
    bgr = cv2.imread(str(PHOTO))
    a = cv2.resize(bgr, (1920, 1080), interpolation=cv2.INTER_LINEAR)
    rgb720 = cv2.cvtColor(cv2.resize(bgr, (1280, 720), interpolation=cv2.INTER_LINEAR),
                          cv2.COLOR_BGR2RGB)
    b = cv2.cvtColor(rgb720, cv2.COLOR_RGB2YUV_YUY2)  # (720, 1280, 2)
    return [
        dict(name="A: 1920x1080 bgr8 -> 640x640 letterbox NCHW f32", frame=a,
             encoding="bgr8", width=1920, height=1080, code=cv2.COLOR_BGR2RGB,
             net=(640, 640), mode="letterbox"),
        dict(name="B: 1280x720 yuv422_yuy2 -> 640x480 stretch NCHW f32", frame=b,
             encoding="yuv422_yuy2", width=1280, height=720, code=cv2.COLOR_YUV2RGB_YUY2,
             net=(640, 480), mode="stretch"),
    ]


def conv_kernel(name: str | None) -> np.ndarray | None:
    if not name:
        return None
    if name == "box":
        return np.full((3, 3), 1 / 9, np.float32)
    if name == "gaussian":
        g = cv2.getGaussianKernel(5, 0)
        return (g @ g.T).astype(np.float32)
    raise SystemExit(f"--conv {name}: use box or gaussian")


def opencv_fn(sc: dict, exact: bool, kernel: np.ndarray | None):
    """The OpenCV + NumPy pipeline of a scenario, as a closure over its frame."""
    frame, code = sc["frame"], sc["code"]
    nw, nh = sc["net"]
    h, w = sc["height"], sc["width"]
    if sc["mode"] == "letterbox":
        s = min(nw / w, nh / h)
        cw, ch = min(nw, int(w * s + 0.5)), min(nh, int(h * s + 0.5))
        top, left = (nh - ch) // 2, (nw - cw) // 2
        border = (top, nh - ch - top, left, nw - cw - left)
    else:
        cw, ch, border = nw, nh, None
    scale = np.float32(1 / 255)

    def run() -> np.ndarray:
        rgb = cv2.cvtColor(frame, code)
        if exact:
            rgb = rgb.astype(np.float32)
        r = cv2.resize(rgb, (cw, ch), interpolation=cv2.INTER_LINEAR)
        if border:
            r = cv2.copyMakeBorder(r, *border, cv2.BORDER_CONSTANT, value=(0, 0, 0))
        x = (r.astype(np.float32) * scale - MEAN) / STD
        if kernel is not None:
            x = cv2.filter2D(x, -1, kernel, borderType=cv2.BORDER_REPLICATE)
        return np.ascontiguousarray(x.transpose(2, 0, 1))[None]

    return run


def time_python(fn, frames: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(frames):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def time_ours(sc: dict, raw: Path, frames: int, warmup: int, conv: str | None) -> list[float]:
    nw, nh = sc["net"]
    sets = [f"network_image_width={nw}", f"network_image_height={nh}",
            f"resize_mode={sc['mode']}", "output_layout=NCHW", "output_dtype=float32",
            "pad_value=[0,0,0]", "image_mean=[0.5]", "image_stddev=[0.5]"]
    if conv:
        sets.append(f"conv.kernel={conv}")
        sets.append(f"conv.size={3 if conv == 'box' else 5}")
    args = [str(CLI), "bench-cpu", "--raw", "--encoding", sc["encoding"], "--width",
            str(sc["width"]), "--height", str(sc["height"]), str(raw), "--json",
            "--frames", str(frames), "--warmup", str(warmup)]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"vision_preproc bench-cpu failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])["samples_ms"]


def pct(v: list[float], q: float) -> float:
    """Nearest-rank percentile (the same rule as `vision_preproc bench-cpu`)."""
    s = sorted(v)
    return s[max(1, min(len(s), int(np.ceil(q * len(s))))) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=200, help="timed frames per round")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--conv", choices=["box", "gaussian"], help="also run conv2d / filter2D")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    if not CLI.exists():
        raise SystemExit(f"{CLI} is missing: cargo build --release --bins")
    kernel = conv_kernel(args.conv)
    results = []
    with tempfile.TemporaryDirectory() as d:
        for sc in scenarios():
            raw = Path(d) / "frame.raw"
            raw.write_bytes(np.ascontiguousarray(sc["frame"]).tobytes())
            typical, exact = opencv_fn(sc, False, kernel), opencv_fn(sc, True, kernel)
            runs = {"ours": [], "typical": [], "exact": []}
            rounds = {"ours": [], "typical": [], "exact": []}
            for _ in range(args.rounds):
                for k, f in (("ours", lambda: time_ours(sc, raw, args.frames, args.warmup, args.conv)),
                             ("typical", lambda: time_python(typical, args.frames, args.warmup)),
                             ("exact", lambda: time_python(exact, args.frames, args.warmup))):
                    v = f()
                    runs[k] += v
                    rounds[k].append(pct(v, 0.5))
            results.append((sc["name"], runs, rounds))
    threads = f"OpenCV threads {cv2.getNumThreads()}, CPUs {os.cpu_count()}"
    head = (f"{platform.processor() or platform.machine()}, {threads}, cv2 {cv2.__version__}, "
            f"numpy {np.__version__}, {args.rounds} rounds x {args.frames} frames, "
            f"load avg {os.getloadavg()[0]:.1f} at the end")
    if args.markdown:
        print(f"_{head}_\n")
        print("| scenario | vision_preproc p50 / p99 ms | OpenCV+NumPy typical p50 / p99 ms "
              "| ratio p50 / p99 | OpenCV exact (float resize) p50 / p99 ms | ratio p50 / p99 "
              "| per-round p50 ours / typical (min-max) |")
        print("|---|---|---|---|---|---|---|")
    else:
        print(head)
    for name, runs, rounds in results:
        o50, o99 = pct(runs["ours"], 0.5), pct(runs["ours"], 0.99)
        t50, t99 = pct(runs["typical"], 0.5), pct(runs["typical"], 0.99)
        e50, e99 = pct(runs["exact"], 0.5), pct(runs["exact"], 0.99)
        spread = (f"{min(rounds['ours']):.2f}-{max(rounds['ours']):.2f} / "
                  f"{min(rounds['typical']):.2f}-{max(rounds['typical']):.2f}")
        if args.markdown:
            print(f"| {name} | {o50:.2f} / {o99:.2f} | {t50:.2f} / {t99:.2f} | "
                  f"**{t50 / o50:.1f}x** / {t99 / o99:.1f}x | {e50:.2f} / {e99:.2f} | "
                  f"{e50 / o50:.1f}x / {e99 / o99:.1f}x | {spread} |")
        else:
            print(f"{name}\n  vision_preproc  p50 {o50:7.3f} ms  p99 {o99:7.3f} ms"
                  f"\n  OpenCV typical  p50 {t50:7.3f} ms  p99 {t99:7.3f} ms   ratio p50 "
                  f"{t50 / o50:.2f}x  p99 {t99 / o99:.2f}x"
                  f"\n  OpenCV exact    p50 {e50:7.3f} ms  p99 {e99:7.3f} ms   ratio p50 "
                  f"{e50 / o50:.2f}x  p99 {e99 / o99:.2f}x"
                  f"\n  per-round p50 (ours / typical): {spread}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
