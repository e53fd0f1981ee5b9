#!/usr/bin/env python3
"""The `camera` scenario's parity, here: the bags it recorded (OUT/camera_<mode>_<group>,
python/vptools/node_scenarios/) hold TensorBatches of live pipelines whose picture is the
same in every frame, so the first batch with every item new from each CUDA mode must equal
the CPU backend's, item by item, within the float32 tolerance (test/tolerances.json; the
conv2d rule for the gaussian of `small()`).

    python3 scripts/device/compare_camera.py DIR    # DIR: the scenario's fetched OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from vptools.bags import read_outputs
from vptools.tolerances import conv_abs_tolerance, tensor_array

GROUPS = 2
CUDA_MODES = ("cuda_upload", "cuda_mapped")
# The gaussian 5x5 of small() normalizes (L1 = 1).
TOLERANCE = conv_abs_tolerance(1.0)


def first_full(bag: Path):
    """The first batch whose items are all valid and new."""
    tensors, _ = read_outputs(bag)
    for b in tensors:
        if all(it.valid and not it.repeated for it in b.items):
            return b
    raise SystemExit(f"{bag}: no batch with every item new ({len(tensors)} batches)")


def main(out: Path) -> int:
    failed = 0
    for g in range(GROUPS):
        cpu = first_full(out / f"camera_cpu_{g}")
        want = tensor_array(cpu)
        for mode in CUDA_MODES:
            got_b = first_full(out / f"camera_{mode}_{g}")
            got = tensor_array(got_b)
            assert got.shape == want.shape, (mode, g, got.shape, want.shape)
            for i, item in enumerate(cpu.items):
                diff = float(np.max(np.abs(got[i].astype(np.float64) - want[i].astype(np.float64))))
                # Colour bars, letterboxed: a tensor of one value would be a blank frame.
                spread = float(np.std(want[i]))
                ok = diff <= TOLERANCE and got_b.items[i].source_encoding == item.source_encoding and spread > 0.1
                failed += not ok
                print(f"group {g} item {i} {item.source_encoding:12s} {mode}: max |cuda - cpu| {diff:.3g} "
                      f"(std of the CPU tensor {spread:.2f}; {'ok' if ok else 'FAILED'}, tolerance {TOLERANCE:g})")
    print(f"camera parity: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
