#!/usr/bin/env python3
"""The `compressed` scenario's parity, here: the bags it recorded (OUT/compressed_<mode>,
python/vptools/node_scenarios/) hold one Tensor per JPEG frame of the played bag (1080p
q90 4:2:0 -> 64x48 + gaussian 5, config/default.yaml's normalization). The CUDA backend
decodes with nvJPEG, the CPU backend with the CPU decoder: their pixels differ by at most
`jpeg_gpu_decode`'s 4:2:0 `max_abs` levels (test/tolerances.json), which the resize and the
normalized gaussian (convex combinations) cannot enlarge, so every CUDA tensor must equal
the CPU tensor of the same stamp within max_abs * pixel_scale / stddev plus the conv2d
float tolerance; and not be blank.

    python3 scripts/device/compare_compressed.py DIR    # DIR: the scenario's fetched OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from vptools.bags import read_outputs
from vptools.tolerances import JPEG_GPU_DECODE, conv_abs_tolerance, tensor_array

CUDA_MODES = ("cuda_upload", "cuda_mapped")
FRAMES = 8  # the bag's
# config/default.yaml: pixel_scale 1/255, image_stddev 0.5; the gaussian 5x5 normalizes.
TOLERANCE = JPEG_GPU_DECODE["colour_420"]["max_abs"] / 255.0 / 0.5 + conv_abs_tolerance(1.0)


def by_stamp(bag: Path) -> dict[int, object]:
    tensors, _ = read_outputs(bag)
    return {t.header.stamp.sec * 10**9 + t.header.stamp.nanosec: t for t in tensors}


def main(out: Path) -> int:
    cpu = by_stamp(out / "compressed_cpu")
    failed = int(len(cpu) != FRAMES)
    print(f"cpu: {len(cpu)} tensors (want {FRAMES})")
    for mode in CUDA_MODES:
        got = by_stamp(out / f"compressed_{mode}")
        failed += int(set(got) != set(cpu))
        worst = 0.0
        for stamp, want in sorted(cpu.items()):
            if stamp not in got:
                print(f"{mode}: no tensor for stamp {stamp}")
                continue
            a, b = tensor_array(got[stamp]), tensor_array(want)
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            spread = float(np.std(b))
            ok = (a.shape == b.shape and diff <= TOLERANCE and spread > 0.1
                  and got[stamp].source_encoding == want.source_encoding)
            failed += not ok
            worst = max(worst, diff)
            print(f"{mode} {stamp}: max |cuda - cpu| {diff:.4f} (std {spread:.2f}, "
                  f"{want.source_encoding!r}; {'ok' if ok else 'FAILED'})")
        print(f"{mode}: {len(got)} tensors, worst {worst:.4f}, tolerance {TOLERANCE:.4f}")
    print(f"compressed parity: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
