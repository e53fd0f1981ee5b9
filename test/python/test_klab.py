"""The kernel lab stays out of the product and in step with it: kernels/resize_normalize.cu
holds no lab switch (the staged path, `RN_STAGED`, is the product's and the tests'), and
every variant bench/klab/kernel_lab.py builds is still made from that file by
bench/klab/klab_variants.py, each patch finding its text exactly once. Text only: the lab
compiles them with NVRTC (bench/klab/klab_stage.sh)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KLAB = ROOT / "bench" / "klab"
sys.path.insert(0, str(KLAB))

import kernel_lab  # noqa: E402
import klab_variants  # noqa: E402

KERNEL = (ROOT / "kernels" / "resize_normalize.cu").read_text()
# The -D defines the product passes: kernels/nvrtc_options.txt and the staged path's.
HOST_DEFINES = set(re.findall(r"^-D(\w+)", (ROOT / "kernels" / "nvrtc_options.txt").read_text(), re.M))
HOST_DEFINES.add("RN_STAGED")


def test_the_shipped_kernel_holds_no_lab_switch() -> None:
    switches = re.findall(r"^#\s*(?:ifndef|ifdef|if|elif)\b.*\b(RN_\w+)", KERNEL, re.M)
    assert switches == ["RN_STAGED"], switches


@pytest.mark.parametrize("label", [l for l, v in kernel_lab.VARIANTS.items() if v[0] == "new"])
def test_each_lab_variant_is_made_from_the_shipped_kernel(label: str) -> None:
    _, constants, patches = kernel_lab.VARIANTS[label]
    source, left = klab_variants.variant_source(KERNEL, constants, patches)
    assert set(left) <= HOST_DEFINES, f"{label}: no such constant in the kernel: {sorted(set(left) - HOST_DEFINES)}"
    if constants or patches:
        assert source != KERNEL, f"{label}: made the shipped kernel unchanged"


def test_a_patch_whose_text_is_gone_fails() -> None:
    # The detector of the test above: a kernel without the patch's text is refused.
    with pytest.raises(ValueError, match="nomid"):
        klab_variants.apply_patch(KERNEL.replace("if constexpr (S == 2)", "if constexpr (S == 3)"), "nomid")
    with pytest.raises(ValueError, match="RN_MIN_BLOCKS_SPAN"):
        klab_variants.variant_source(KERNEL + "#define RN_MIN_BLOCKS_SPAN 4\n", {"RN_MIN_BLOCKS_SPAN": 5}, ())
