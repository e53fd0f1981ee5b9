#!/usr/bin/env python3
"""Single-thread memcpy rate of this machine at the message path's sizes, for the per-copy
ledger of docs/BENCHMARKS.md: each copy the node (or the middleware) makes of a
frame or a tensor costs bytes / this rate.

- cached: the same source and destination every time (both stay in the last-level
  cache when they fit, as a frame just written by rmw is);
- rotating: 8 different source/destination pairs in turn (64+ MB: through DRAM).

With `--pinned` (needs CuPy: the GPU machine), also the copy of a frame from pageable
memory into page-locked memory, write-combined (the CUDA backend's upload staging) and
cached (its download buffers and the node's message), by 1, 2, 4 and 8 threads in equal
pieces (NumPy releases the GIL while it copies).

Median of `--repeats` copies after a warm-up, GB/s = bytes copied / time (one write and
one read of each byte). Prints JSON.

Usage: python3 bench/memcpy_rate.py [--repeats 200] [--pinned]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SIZES = {"tensor 640x640x3 f32": 640 * 640 * 3 * 4, "frame 1280x720 bgr8": 1280 * 720 * 3,
         "frame 1920x1080 bgr8": 1920 * 1080 * 3}


def rate(n: int, repeats: int, pairs: int) -> float:
    rng = np.random.default_rng(1)
    srcs = [rng.integers(0, 255, n, dtype=np.uint8) for _ in range(pairs)]
    dsts = [np.ones(n, np.uint8) for _ in range(pairs)]
    times = []
    for i in range(repeats + 10):
        src, dst = srcs[i % pairs], dsts[i % pairs]
        t = time.perf_counter()
        np.copyto(dst, src)
        dt = time.perf_counter() - t
        if i >= 10:
            times.append(dt)
    return n / float(np.median(times)) / 1e9


def pinned_rates(n: int, repeats: int) -> dict:
    """Pageable -> pinned (write-combined, cached) copy rates by thread count."""
    import ctypes

    import cupy

    src = np.random.default_rng(2).integers(0, 255, n, dtype=np.uint8)
    out = {}
    flags = {"write-combined": cupy.cuda.runtime.hostAllocWriteCombined, "cached": 0}
    for name, flag in flags.items():
        ptr = cupy.cuda.runtime.hostAlloc(n, flag)
        dst = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))
        dst[:] = 1
        for threads in (1, 2, 4, 8):
            piece = -(-n // threads)
            pool = ThreadPoolExecutor(threads)

            def copy() -> None:
                list(pool.map(lambda i: np.copyto(dst[i:i + piece], src[i:i + piece]),
                              range(0, n, piece)))

            times = []
            for i in range(repeats + 5):
                t = time.perf_counter()
                copy()
                if i >= 5:
                    times.append(time.perf_counter() - t)
            pool.shutdown()
            out[f"{name} x{threads}"] = round(n / float(np.median(times)) / 1e9, 2)
        cupy.cuda.runtime.freeHost(ptr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--pinned", action="store_true", help="also pageable -> pinned (needs CuPy)")
    a = ap.parse_args()
    out = {"cpus": os.cpu_count(), "load": os.getloadavg(), "numpy": np.__version__, "rates_gb_s": {}}
    for name, n in SIZES.items():
        out["rates_gb_s"][name] = {"bytes": n, "cached": round(rate(n, a.repeats, 1), 2),
                                   "rotating": round(rate(n, a.repeats, 8), 2)}
        if a.pinned and "frame" in name:
            try:
                out["rates_gb_s"][name]["into pinned"] = pinned_rates(n, a.repeats // 2)
            except Exception as e:  # noqa: BLE001 (report, keep the other figures)
                out["rates_gb_s"][name]["into pinned"] = {"error": repr(e)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
