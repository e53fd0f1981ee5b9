#!/usr/bin/env python3
"""CPU benchmark: vision_preproc's CPU backend against the OpenCV + NumPy equivalent, in
one run, on the same frames (real photographs scaled to the frame size).

Scenario sets (--set):
  matrix (default): 3 sizes x 3 encodings (bgr8, yuyv, bayer_rggb8), NCHW float32
    1280x720  -> 640x480   stretch
    1920x1200 -> 640x480   letterbox
    3840x2160 -> 1920x1080 stretch (same aspect: letterbox would be identical)
  spec (the first two scenarios, docs/BENCHMARKS.md):
    A  1920x1080 bgr8        -> 640x640 letterbox
    B  1280x720  yuv422_yuy2 -> 640x480 stretch

vision_preproc: `vision_preproc bench-cpu --json` on the raw frame (each sample is one
whole `Pipeline::process`: decode, resize, pad, normalize, layout).
OpenCV + NumPy, as a user writes it (the "typical" column, the headline ratio):
  cvtColor -> resize (uint8, INTER_LINEAR) -> copyMakeBorder -> astype(float32) * scale
  - mean) / std -> transpose -> ascontiguousarray   (+ filter2D with --conv)
and the same with the resize in float32 (the "exact" column: what the specification
computes, so the same numbers as vision_preproc within tolerance).

Rounds alternate (ours, typical, exact) so that load from other processes on the machine
hits all of them; a run gives p50 and p99 over all frames of a scenario and the spread of
the per-round p50s. --runs N repeats the whole run N times (the Markdown table then gives
the median over runs and the min-max of the runs' p50s); --out writes every run as JSON
(with the load average before and after each run). Frames per round scale down with the
source size (--frames is for 1280x720). Run from the repository root after
`cargo build --release`:

    python3 bench/bench_cpu.py [--set matrix|spec] [--runs 3] [--rounds 5] [--frames 200] \
        [--out docs/evidence/cpu.json] [--markdown]
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
# `bench-cpu` is in the CLI built with the `bench` feature (scripts/test_hooks_build.sh).
CLI = Path(os.environ.get("VISION_PREPROC_CLI", ROOT / "target" / "fault-injection" / "vision_preproc"))
PHOTO = ROOT / "test" / "data" / "rocket.jpg"

MEAN = np.array([0.5, 0.5, 0.5], np.float32)
STD = np.array([0.5, 0.5, 0.5], np.float32)


CV_CODE = {"bgr8": cv2.COLOR_BGR2RGB, "yuyv": cv2.COLOR_YUV2RGB_YUY2,
           "yuv422_yuy2": cv2.COLOR_YUV2RGB_YUY2, "bayer_rggb8": cv2.COLOR_BayerRGGB2RGB}
MATRIX_SIZES = (((1280, 720), (640, 480), "stretch"),
                ((1920, 1200), (640, 480), "letterbox"),
                ((3840, 2160), (1920, 1080), "stretch"))
MATRIX_ENCODINGS = ("bgr8", "yuyv", "bayer_rggb8")


def frame_of(encoding: str, w: int, h: int) -> np.ndarray:
    """The photograph scaled to w x h (INTER_LINEAR) in `encoding`, as OpenCV's input array
    (bgr8: (h, w, 3); yuyv: (h, w, 2); bayer: (h, w))."""
    rgb = cv2.cvtColor(cv2.resize(cv2.imread(str(PHOTO)), (w, h), interpolation=cv2.INTER_LINEAR),
                       cv2.COLOR_BGR2RGB)
    if encoding == "bgr8":
        return np.ascontiguousarray(rgb[..., ::-1])
    if encoding in ("yuyv", "yuv422_yuy2"):
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_YUY2)
    if encoding == "bayer_rggb8":  # R at (even, even), G at (even, odd) and (odd, even), B at (odd, odd)
        plane = np.empty((h, w), np.uint8)
        for k, (dy, dx) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            plane[dy::2, dx::2] = rgb[dy::2, dx::2, (0, 1, 1, 2)[k]]
        return plane
    raise ValueError(encoding)


def scenario(encoding: str, src: tuple[int, int], net: tuple[int, int], mode: str,
             name: str | None = None) -> dict:
    (w, h), (nw, nh) = src, net
    return dict(name=name or f"{w}x{h} {encoding} -> {nw}x{nh} {mode}", frame=frame_of(encoding, w, h),
                encoding=encoding, width=w, height=h, code=CV_CODE[encoding], net=net, mode=mode)


def scenarios(which: str) -> list[dict]:
    if which == "spec":
        return [scenario("bgr8", (1920, 1080), (640, 640), "letterbox",
                         "A: 1920x1080 bgr8 -> 640x640 letterbox NCHW f32"),
                scenario("yuv422_yuy2", (1280, 720), (640, 480), "stretch",
                         "B: 1280x720 yuv422_yuy2 -> 640x480 stretch NCHW f32")]
    return [scenario(enc, src, net, mode) for src, net, mode in MATRIX_SIZES for enc in MATRIX_ENCODINGS]


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


def one_run(scs: list[dict], args, kernel, d: str) -> list[dict]:
    """All scenarios once (rounds alternating ours / typical / exact)."""
    out = []
    for sc in scs:
        raw = Path(d) / "frame.raw"
        raw.write_bytes(np.ascontiguousarray(sc["frame"]).tobytes())
        frames = max(30, round(args.frames * 1280 * 720 / (sc["width"] * sc["height"])))
        warmup = max(5, args.warmup * frames // args.frames)
        typical, exact = opencv_fn(sc, False, kernel), opencv_fn(sc, True, kernel)
        runs = {"ours": [], "typical": [], "exact": []}
        rounds = {"ours": [], "typical": [], "exact": []}
        for _ in range(args.rounds):
            for k, f in (("ours", lambda: time_ours(sc, raw, frames, warmup, args.conv)),
                         ("typical", lambda: time_python(typical, frames, warmup)),
                         ("exact", lambda: time_python(exact, frames, warmup))):
                v = f()
                runs[k] += v
                rounds[k].append(pct(v, 0.5))
        res = {"name": sc["name"], "encoding": sc["encoding"], "source": f"{sc['width']}x{sc['height']}",
               "net": "x".join(map(str, sc["net"])), "mode": sc["mode"], "frames_per_round": frames}
        for k in runs:
            res[k] = {"p50_ms": pct(runs[k], 0.5), "p99_ms": pct(runs[k], 0.99),
                      "round_p50_ms": rounds[k], "frames": len(runs[k])}
        res["ratio_p50"] = res["typical"]["p50_ms"] / res["ours"]["p50_ms"]
        res["ratio_p99"] = res["typical"]["p99_ms"] / res["ours"]["p99_ms"]
        out.append(res)
        print(f"  {sc['name']}: ours {res['ours']['p50_ms']:.2f} ms, typical {res['typical']['p50_ms']:.2f} ms, "
              f"exact {res['exact']['p50_ms']:.2f} ms (p50)", file=sys.stderr, flush=True)
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def report(meta: dict, all_runs: list[dict], markdown: bool = True) -> list[str]:
    """The table of a results file: per scenario, the median over runs of p50 and p99 and the
    min-max of the runs' p50s."""
    loads = [r["load_before"][0] for r in all_runs] + [r["load_after"][0] for r in all_runs]
    head = (f"{meta['machine']}, OpenCV threads {meta['cv2_threads']}, cv2 {meta['cv2']}, "
            f"numpy {meta['numpy']}, {len(all_runs)} run(s) x {meta['rounds']} rounds, {meta['date']}, "
            f"commit {meta['commit']}, load avg {min(loads):.1f}-{max(loads):.1f}")
    med = lambda v: float(np.median(v))  # noqa: E731
    lines = []
    if markdown:
        lines += [f"_{head}_", "",
                  "| scenario | vision_preproc p50 / p99 ms | OpenCV+NumPy typical p50 / p99 ms "
                  "| ratio p50 / p99 | OpenCV exact (float resize) p50 / p99 ms | runs' p50 ours / typical (min-max) |",
                  "|---|---|---|---|---|---|"]
    else:
        lines.append(head)
    for j, sc in enumerate(all_runs[0]["scenarios"]):
        rs = [r["scenarios"][j] for r in all_runs]
        g = {k: (med([r[k]["p50_ms"] for r in rs]), med([r[k]["p99_ms"] for r in rs]))
             for k in ("ours", "typical", "exact")}
        o50s, t50s = [r["ours"]["p50_ms"] for r in rs], [r["typical"]["p50_ms"] for r in rs]
        spread = f"{min(o50s):.2f}-{max(o50s):.2f} / {min(t50s):.2f}-{max(t50s):.2f}"
        (o50, o99), (t50, t99), (e50, e99) = g["ours"], g["typical"], g["exact"]
        if markdown:
            lines.append(f"| {sc['name']} | {o50:.2f} / {o99:.2f} | {t50:.2f} / {t99:.2f} | "
                         f"**{t50 / o50:.1f}x** / {t99 / o99:.1f}x | {e50:.2f} / {e99:.2f} | {spread} |")
        else:
            lines.append(f"{sc['name']}\n  vision_preproc  p50 {o50:7.3f} ms  p99 {o99:7.3f} ms"
                         f"\n  OpenCV typical  p50 {t50:7.3f} ms  p99 {t99:7.3f} ms   ratio p50 "
                         f"{t50 / o50:.2f}x  p99 {t99 / o99:.2f}x"
                         f"\n  OpenCV exact    p50 {e50:7.3f} ms  p99 {e99:7.3f} ms   ratio p50 "
                         f"{e50 / o50:.2f}x  p99 {e99 / o99:.2f}x"
                         f"\n  runs' p50 (ours / typical): {spread}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", dest="which", choices=["matrix", "spec"], default="matrix")
    ap.add_argument("--runs", type=int, default=1, help="repeat the whole run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=200, help="timed frames per round (1280x720)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--conv", choices=["box", "gaussian"], help="also run conv2d / filter2D")
    ap.add_argument("--only", default="", help="only scenarios whose name contains this")
    ap.add_argument("--out", help="write the runs as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    if not CLI.exists():
        raise SystemExit(f"{CLI} is missing: scripts/test_hooks_build.sh")
    kernel = conv_kernel(args.conv)
    scs = [sc for sc in scenarios(args.which) if args.only in sc["name"]]
    all_runs = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            load0 = os.getloadavg()
            t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            print(f"run {i + 1}/{args.runs} (load {load0[0]:.2f})", file=sys.stderr, flush=True)
            res = one_run(scs, args, kernel, d)
            all_runs.append({"run": i + 1, "start": t0, "load_before": load0, "load_after": os.getloadavg(),
                             "scenarios": res})
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": git_commit(),
            "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
            "cv2": cv2.__version__, "cv2_threads": cv2.getNumThreads(), "numpy": np.__version__,
            "set": args.which, "rounds": args.rounds, "frames_720p": args.frames, "conv": args.conv}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "runs": all_runs}, indent=1))
    print("\n".join(report(meta, all_runs, args.markdown)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
