#!/usr/bin/env python3
"""Compare the tensors of a live recording (`vision_preproc record`) with those of an
offline `vision_preproc replay` of the same input, frame by frame (matched by header
stamp), within the tolerances of test/tolerances.json.

Used for runs on machines where only the node can run (e.g. the GPU node on the H200,
recorded there, replayed on the CPU here): every recorded tensor must equal the replayed
tensor of the same input frame.

Usage: python3 scripts/device/compare_bags.py LIVE_BAG REPLAY_BAG [--conv-l1 SUM_ABS_W]
Prints one line per distinct stamp and a summary; exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from vptools.bags import read_outputs, tensor_array
from vptools.tolerances import assert_close, assert_close_conv


def stamp(t) -> int:
    return int(t.header.stamp.sec) * 10**9 + int(t.header.stamp.nanosec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("live", type=Path)
    ap.add_argument("replay", type=Path)
    ap.add_argument("--conv-l1", type=float, default=0.0,
                    help="sum|w| of the conv2d the node ran (0: none); scales the tolerance")
    a = ap.parse_args()
    live, _ = read_outputs(a.live)
    ref, _ = read_outputs(a.replay)
    by_stamp = {stamp(t): t for t in ref}
    if not live:
        print(f"{a.live}: no tensors")
        return 1
    worst: dict[int, float] = {}
    bad = 0
    for t in live:
        s = stamp(t)
        r = by_stamp.get(s)
        if r is None:
            print(f"stamp {s}: not in the replay")
            bad += 1
            continue
        x, e = tensor_array(t).astype(np.float64), tensor_array(r).astype(np.float64)
        if x.shape != e.shape or t.layout != r.layout or t.dtype != r.dtype:
            print(f"stamp {s}: shape/layout/dtype {x.shape} {t.layout} {t.dtype} != {e.shape} {r.layout} {r.dtype}")
            bad += 1
            continue
        try:
            if a.conv_l1 > 0:
                assert_close_conv(x, e, t.dtype, a.conv_l1, f"stamp {s}")
            else:
                assert_close(x, e, t.dtype, f"stamp {s}")
        except AssertionError as err:
            print(err)
            bad += 1
        diff = np.abs(x - e)
        worst[s] = max(worst.get(s, 0.0), float(diff.max()))
    for s, d in sorted(worst.items()):
        print(f"stamp {s}: max |live - replay| {d:.3e}")
    print(f"compare_bags: {len(live)} live tensors, {len(worst)} distinct frames, {len(ref)} replayed; "
          f"{bad} out of tolerance; max |diff| {max(worst.values(), default=0.0):.3e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
