#!/usr/bin/env python3
"""The aarch64 build's CLI against the x86-64 build's, bit for bit (scripts/aarch64/aarch64.sh).

Both CLIs run `run-file` on the same frames with the same settings; their .npy files
must be equal byte for byte (header and data). The CPU backend is the specification, so
the tolerance is zero (TOLERANCE_BYTES below, the only one).

The matrix: every encoding (16-bit ones in both byte orders) x every resize mode x both
layouts x both dtypes, on a seeded random raw frame, with the other settings cycling
(interpolation, channel order, 1 or 3 output channels, roi, an upscale and a downscale
network size, so both decode paths of the fast pass run); then conv2d kernels (box,
gaussian, sobel_x, laplacian; every border) on a few encodings; then a photograph (PNG
decode). Usage:

    aarch64_parity.py --x86 X86_CLI --arm "qemu-aarch64 -L /usr/aarch64-linux-gnu ARM_CLI" \
        [--arm-extra=--cpu-simd=baseline] [--jobs 2] [--work DIR]
"""

import argparse
import concurrent.futures
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time

# The CPU backend is the specification: two builds of it may differ by nothing.
TOLERANCE_BYTES = 0

# (name, bytes per pixel, 16-bit); 4:2:2 needs even width, 4:2:0 even width and height.
ENCODINGS = [
    ("rgb8", 3, False), ("bgr8", 3, False), ("rgba8", 4, False), ("bgra8", 4, False),
    ("mono8", 1, False), ("mono16", 2, True), ("rgb16", 6, True), ("bgr16", 6, True),
    ("yuyv", 2, False), ("yuv422_yuy2", 2, False), ("uyvy", 2, False), ("yuv422", 2, False),
    ("nv12", 1, False), ("nv21", 1, False),
    ("bayer_rggb8", 1, False), ("bayer_bggr8", 1, False), ("bayer_gbrg8", 1, False),
    ("bayer_grbg8", 1, False),
]
MODES = ["stretch", "letterbox", "center_crop"]
LAYOUTS = ["NCHW", "NHWC"]
DTYPES = ["float32", "float16"]
SRC_W, SRC_H, PAD = 94, 62, 5          # a padded row stride
NET_SIZES = [(64, 48), (160, 120)]     # downscale (taps decoded) / upscale (row predecoded)


def frame(work, enc, bpp, seed):
    """A seeded random raw frame of `enc` (every byte pattern is a valid frame)."""
    step = SRC_W * bpp + PAD
    rows = SRC_H * 3 // 2 if enc in ("nv12", "nv21") else SRC_H
    path = os.path.join(work, f"{enc}.raw")
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(random.Random(seed).randbytes(step * rows))
    return path, ["--raw", "--encoding", enc, "--width", str(SRC_W), "--height", str(SRC_H),
                  "--step", str(step)]


def cases(work):
    """(name, run-file arguments without -o)."""
    out = []
    k = 0
    for ei, (enc, bpp, is16) in enumerate(ENCODINGS):
        path, raw = frame(work, enc, bpp, 1000 + ei)
        for be in ([False, True] if is16 else [False]):
            for mode in MODES:
                for layout in LAYOUTS:
                    for dtype in DTYPES:
                        k += 1
                        nw, nh = NET_SIZES[k % 2]
                        sets = {
                            "resize_mode": mode, "output_layout": layout, "output_dtype": dtype,
                            "network_image_width": nw, "network_image_height": nh,
                            "interpolation": "nearest" if k % 5 == 0 else "linear",
                            "channel_order": "bgr" if k % 3 == 0 else "rgb",
                            "letterbox_anchor": "top_left" if k % 7 == 0 else "center",
                            "pad_value": "[114,30.5,250]",
                        }
                        if k % 4 == 0:
                            sets.update(output_channels=1, image_mean="[0.449]",
                                        image_stddev="[0.226]")
                        if k % 6 == 1:
                            sets["roi"] = "[3,1,60,41]"
                        args = raw + (["--big-endian"] if be else []) + [path]
                        name = f"{enc}{' be' if be else ''} {mode} {layout} {dtype} #{k}"
                        out.append((name, args + [f"--set={a}={v}" for a, v in sets.items()]))
    borders = ["replicate", "constant", "reflect101"]
    for i, (kernel, size) in enumerate([("box", 3), ("gaussian", 5), ("sobel_x", 3),
                                        ("laplacian", 3), ("gaussian", 7)]):
        for enc in ("bgr8", "yuyv", "bayer_grbg8", "rgb16"):
            bpp = next(e[1] for e in ENCODINGS if e[0] == enc)
            path, raw = frame(work, enc, bpp, 1000 + [e[0] for e in ENCODINGS].index(enc))
            sets = {"conv.kernel": kernel, "conv.size": size, "conv.border": borders[i % 3],
                    "output_layout": LAYOUTS[i % 2], "output_dtype": DTYPES[(i // 2) % 2],
                    "network_image_width": 64, "network_image_height": 48}
            out.append((f"conv {kernel} {size} {borders[i % 3]} {enc}",
                        raw + [path] + [f"--set={a}={v}" for a, v in sets.items()]))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for photo in ("chelsea.png", "rocket.jpg"):
        out.append((f"photo {photo}", [os.path.join(root, "test", "data", photo),
                                       "--set=resize_mode=letterbox"]))
    return out


def run(cmd, out_path):
    r = subprocess.run(cmd + ["-o", out_path], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    with open(out_path, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--x86", required=True, help="the x86-64 CLI (command, shell-split)")
    ap.add_argument("--arm", required=True, help="the aarch64 CLI with its emulator (shell-split)")
    ap.add_argument("--arm-extra", default="", help="extra run-file arguments for the aarch64 CLI")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", help="folder for frames and outputs (default: a temporary one)")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="vp-aarch64-parity-")
    os.makedirs(work, exist_ok=True)
    x86 = shlex.split(a.x86)
    arm = shlex.split(a.arm)
    extra = shlex.split(a.arm_extra)
    todo = cases(work)
    t0 = time.monotonic()
    failures, outputs = [], {}
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(compare, x86, arm, name, args, extra, work, i)
                for i, (name, args) in enumerate(todo)]
        for f in futs:
            name, err, data = f.result()
            outputs[name] = data
            if err:
                failures.append(f"{name}: {err}")
    # The comparison can fail: different settings must give different tensors (a build
    # that wrote the same bytes whatever it was asked would otherwise pass).
    distinct = len(set(outputs.values()))
    if distinct < len(outputs) * 9 // 10:
        failures.append(f"only {distinct} distinct outputs for {len(outputs)} cases")
    secs = time.monotonic() - t0
    for line in failures:
        print("DIFFERENT", line)
    print(f"aarch64 parity: {len(todo) - len(failures)}/{len(todo)} cases equal bit for bit "
          f"({distinct} distinct outputs, {secs:.0f} s, work {work})")
    sys.exit(1 if failures else 0)


def compare(x86, arm, name, args, extra, work, i):
    """One case: x86 runs `args`, aarch64 `extra + args`; (name, error or None, bytes)."""
    a = run(x86 + ["run-file"] + args, os.path.join(work, f"{i}.x86.npy"))
    b = run(arm + ["run-file"] + extra + args, os.path.join(work, f"{i}.arm.npy"))
    if len(a) != len(b):
        return name, f"sizes differ: x86 {len(a)} bytes, aarch64 {len(b)} bytes", a
    diff = [j for j, (p, q) in enumerate(zip(a, b)) if p != q]
    if len(diff) > TOLERANCE_BYTES:
        return name, (f"{len(diff)} of {len(a)} bytes differ (tolerance {TOLERANCE_BYTES}), "
                      f"first at byte {diff[0]}: x86 {a[diff[0]]:#04x}, aarch64 {b[diff[0]]:#04x}"), a
    return name, None, a


if __name__ == "__main__":
    main()
