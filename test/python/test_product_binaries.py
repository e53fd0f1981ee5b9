"""The product binaries (`make build`: target/release/) hold no test hook and no benchmark
(issue 14): no symbol of the fault injection, the poisoned outputs or the CLI's `bench`
module, and none of the strings only those use. The binaries built with the hooks
(target/fault-injection/, scripts/test_hooks_build.sh) must show them, so the check can
fail."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from vptools import BIN_DIR, HOOKS_BIN_DIR

HOOKED = HOOKS_BIN_DIR
SYMBOLS = re.compile(
    r"vision_preproc::(pipeline::fault|pipeline::deferred|backend::cuda::fault|bench|bench_cpu|bench_batch"
    r"|conv_file|decode_file|geometry_cases|boxes::cases)::|::inject_fault\b|::set_poison_outputs\b")
STRINGS = (b"VISION_PREPROC_INJECT_CUDA_FAULT", b"VISION_PREPROC_TEST_DEFERRED_CPU", b"baseline_resize_rgb8",
           b"measure_clock")


def hooks_in(binary: Path) -> list[str]:
    """The test-hook and benchmark symbols (`nm -C`) and strings found in `binary`."""
    nm = subprocess.run(["nm", "-C", str(binary)], capture_output=True, text=True, check=True).stdout
    symbols = sorted({line.split(" ", 2)[-1] for line in nm.splitlines() if SYMBOLS.search(line)})
    data = binary.read_bytes()
    return symbols + [s.decode() for s in STRINGS if s in data]


@pytest.mark.parametrize("name", ["vision_preproc_node", "vision_preproc_lifecycle_node", "vision_preproc"])
def test_product_binaries_hold_no_test_hook_and_no_benchmark(name: str) -> None:
    product, hooked = BIN_DIR / name, HOOKED / name
    assert product.exists(), f"{product} missing: run `make build`"
    assert hooked.exists(), f"{hooked} missing: run scripts/test_hooks_build.sh (scripts/test.sh does)"
    assert hooks_in(product) == [], f"{product} contains test hooks or the benchmark"
    found = hooks_in(hooked)
    assert found, f"{hooked}: nothing found in the build WITH the hooks, so the check proves nothing"
    print(f"{name}: product clean; with the hooks: {len(found)} found, e.g. {found[:3]}")
