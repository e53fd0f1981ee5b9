#!/usr/bin/env python3
"""Single-thread memcpy rate of this machine at the message path's sizes, for the per-copy
ledger of docs/BENCHMARKS.md (issue 12): each copy the node (or the middleware) makes of a
frame or a tensor costs bytes / this rate.

- cached: the same source and destination every time (both stay in the last-level
  cache when they fit, as a frame just written by rmw is);
- rotating: 8 different source/destination pairs in turn (64+ MB: through DRAM).

Median of `--repeats` copies after a warm-up, GB/s = bytes copied / time (one write and
one read of each byte). Prints JSON.

Usage: python3 bench/memcpy_rate.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import os
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    out = {"cpus": os.cpu_count(), "load": os.getloadavg(), "numpy": np.__version__, "rates_gb_s": {}}
    for name, n in SIZES.items():
        out["rates_gb_s"][name] = {"bytes": n, "cached": round(rate(n, a.repeats, 1), 2),
                                   "rotating": round(rate(n, a.repeats, 8), 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
