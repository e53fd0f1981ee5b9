"""The kernel lab's variants of the fused kernel, made from the shipped source.

kernels/resize_normalize.cu holds the kernel the product ships (and its staged path,
`-DRN_STAGED=1`, which the tests and the benchmark use) and nothing else. A variant is
that source with edits:
  - constants: a `#define NAME VALUE` line of the file set to another value
    (`RN_MIN_BLOCKS_SPAN: 5`); a name the file takes from the host (`RN_PX`, the options
    of kernels/nvrtc_options.txt) or under `#ifndef` (`RN_STAGED`) stays a `-D` option;
  - patches (PATCHES): each a list of (text that stands exactly once in the source, its
    replacement); a replacement's SECTION is the patch's section of klab_variants.cu, the
    code the shipped kernel does not hold.
An edit whose text does not stand exactly once fails with its name, so a change of the
shipped kernel that a patch no longer fits shows at once: test/python/test_klab.py applies
every variant of kernel_lab.py (no NVRTC needed), kernel_lab.py --dry-run does the same.

Variants measured, rejected and no longer built (their numbers in
docs/evidence/gpu_history.md, *Versions*): rgb tap pairs read as aligned words (24.2
against 20.9 us, version 6, docs/evidence/h200_2026-11-29_variants_run{1,2}.txt); the
mantissa int -> float for every tap (24.8 us, 2026-11-29); the span path with 4- or
16-byte vectors and with I2F byte conversion (no faster, or slower with spills:
docs/evidence/h200_2026-12-02_kernel_lab_run{1,2}.log, versions 7 and 8); generic loads
in the batch kernel (the kernel before version 8).
"""

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
FRAGMENTS = os.path.join(HERE, "klab_variants.cu")
SECTION = "<SECTION>"  # in a replacement: the patch's section of klab_variants.cu
END = None  # as an edit's text: append the replacement to the source

# The direct path's per-tile call in resize_normalize (the prefetch goes before it).
_DIRECT_TILE = "            rn_pixels<ENC, false>(p, src, maps, dst, 0u, 0, nullptr, tile_x0, tile_y0);\n"

PATCHES = {
    # Byte loads only: no encoding takes the span path, so every entry point and the
    # batch kernel get the register cap of the byte path (RN_MIN_BLOCKS).
    "nospan": [
        ("    return e == ENC_RGB8 || e == ENC_BGR8 || e == ENC_RGBA8 || e == ENC_BGRA8;\n",
         "    return false;\n"),
        ("__launch_bounds__(RN_THREADS, RN_MIN_BLOCKS_SPAN)\n    resize_normalize_batch(",
         "__launch_bounds__(RN_THREADS, RN_MIN_BLOCKS)\n    resize_normalize_batch("),
    ],
    # Without the exact-2x midpoint path: every span group through the lerps.
    "nomid": [
        ("    if constexpr (S == 2) {\n        if (mid) {", "    if constexpr (false) {\n        if (mid) {"),
    ],
    # The direct path's blocks ask L2 for the source rows of their next tile (sm_90;
    # rejected: version 9, docs/evidence/h200_2026-12-02_kernel_lab_run2.log).
    "prefetch": [(_DIRECT_TILE, SECTION + _DIRECT_TILE)],
    # + resize_normalize_batch_<enc>: the batch kernel with one encoding's code (rejected:
    # 11.9 against 12.1-12.2 us, within the noise, for +10 s of NVRTC compile).
    "batch_enc": [(END, "\n" + SECTION)],
}


def sections(path=FRAGMENTS):
    """klab_variants.cu's sections by name (the text after each `// @@ NAME` line)."""
    out, name = {}, None
    for line in open(path).read().splitlines(keepends=True):
        m = re.match(r"// @@ (\w+)\s*$", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line
    return {k: v.rstrip("\n") + "\n" for k, v in out.items()}


def apply_patch(text, name, fragments=None):
    """`text` with patch `name` applied; ValueError when an edit's text is not there once."""
    fragments = sections() if fragments is None else fragments
    for old, new in PATCHES[name]:
        new = new.replace(SECTION, fragments.get(name, ""))
        if old is END:
            text += new
            continue
        n = text.count(old)
        if n != 1:
            raise ValueError(f"patch {name}: its text stands {n} times in the source, not once: {old[:70]!r}")
        text = text.replace(old, new)
    return text


def variant_source(text, defines, patches):
    """(source, defines left for -D options) of a variant of `text`: each constant the file
    defines itself set in place, then each patch applied."""
    left = {}
    for name, value in defines.items():
        line = re.compile(rf"^#define {re.escape(name)} \S+$", re.M)
        if re.search(rf"^#ifndef {re.escape(name)}$", text, re.M) or not line.search(text):
            left[name] = value
            continue
        if len(line.findall(text)) != 1:
            raise ValueError(f"constant {name}: defined more than once")
        text = line.sub(f"#define {name} {value}", text)
    fragments = sections()
    for p in patches:
        text = apply_patch(text, p, fragments)
    return text, left
